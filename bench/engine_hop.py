"""The engine hop alone: one `/generate` call through each transport the gateway can use.

Against the instant stub engine (bench/stub_engine.py), a body of 1k and of 32k prompt ids (as
the gateway sends at those history sizes) is posted `--calls` times through `Http1Transport`
(the gateway's for http:// engines) and `AiohttpTransport` (its https:// one), interleaved, on
uvloop as under `rlgw serve`. Prints p50/p99 per transport and the difference.

    python -m bench.engine_hop [--calls 2000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import orjson
import uvloop

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.gateway import pct, process, qwen3_tokenizer_dir  # noqa: E402
from bench.passthrough import ENGINE_IDS  # noqa: E402
from rlgw.gateway.engine_client.http1_transport import Http1Transport  # noqa: E402
from rlgw.gateway.engine_client.transport import AiohttpTransport, Transport  # noqa: E402
from tests.support.procs import free_port  # noqa: E402


async def _call(transport: Transport, body: bytes) -> float:
    started = time.perf_counter()
    reply = await transport.request("POST", "/generate", body, {"Content-Type": "application/json"})
    await reply.read()
    return time.perf_counter() - started


async def _measure(url: str, calls: int) -> None:
    transports: dict[str, Transport] = {"http1": Http1Transport(url), "aiohttp": AiohttpTransport(url)}
    print(
        f"{'prompt ids':>10} | {'Http1Transport p50/p99':>24} | {'AiohttpTransport p50/p99':>26} | saved p50"
    )
    for n_ids in (1000, 32000):
        body = orjson.dumps(
            {"input_ids": ENGINE_IDS[:n_ids], "sampling_params": {}, "return_logprob": True},
            option=orjson.OPT_SERIALIZE_NUMPY,
        )
        times: dict[str, list[float]] = {name: [] for name in transports}
        for i in range(calls):
            for name in list(transports)[i % 2 :] + list(transports)[: i % 2]:  # alternate who goes first
                times[name].append(await _call(transports[name], body))
        h, a = (sorted(times[n]) for n in ("http1", "aiohttp"))
        saved = (pct(a, 0.5) - pct(h, 0.5)) * 1e3
        print(
            f"{n_ids:>10} | {pct(h, 0.5) * 1e3:>10.3f}/{pct(h, 0.99) * 1e3:>7.3f} ms    | "
            f"{pct(a, 0.5) * 1e3:>12.3f}/{pct(a, 0.99) * 1e3:>7.3f} ms   | {saved:.3f} ms"
        )
    for t in transports.values():
        await t.aclose()


def main() -> None:
    """Start the stub, time both transports."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000, help="calls per transport and body size")
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    stub = ["-m", "bench.stub_engine", "--tokenizer", qwen3_tokenizer_dir(), "--port", str(port)]
    with process(stub, url + "/health"):
        uvloop.run(_measure(url, args.calls))


if __name__ == "__main__":
    main()
