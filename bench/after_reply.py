"""The gateway's own CPU for the same work with the engine idle and right after an engine's reply (issue 36).

Starts vLLM (the `uni` worker, as the tests do; `python -m tests.support.vllm_env` builds it) and the
embedded engine on tiny-qwen3 with 64-wide heads, `rlgw serve` in front of each, and times the gateway's
CPU (its process's scheduler time) for a session creation, which never reaches the engine: 100 in a row
with the engine idle, then 100 each right after a direct generate call to the gateway's engine (a tool-call
turn, greedy, up to 64 tokens). Same code, same inputs: what differs is what the machine did just before.
Prints p50 and mean per engine and round, and vLLM's "after a reply" p50 over the embedded engine's.

    python -m bench.after_reply [--rounds 2] [--calls 100]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.gateway import cpu_seconds  # noqa: E402
from bench.turn_legs import CASES, KW, gateway, sglang_generate, vllm_generate, vllm_model  # noqa: E402
from tests.support.procs import engine_server  # noqa: E402
from tests.support.vllm_env import vllm_server  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of both measurements per engine")
    ap.add_argument("--calls", type=int, default=100, help="session creations per measurement")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir, contextlib.ExitStack() as stack:
        tmp = Path(tmp_dir)
        model, tok = vllm_model(tmp)
        vllm = stack.enter_context(vllm_server(model, log=tmp / "vllm.log"))
        embedded = stack.enter_context(engine_server(model))
        arms = {
            "vLLM 0.32.0": (vllm, vllm_generate, *stack.enter_context(gateway(vllm, "vllm", tmp))),
            "embedded": (embedded, sglang_generate, *stack.enter_context(gateway(embedded, "sglang", tmp))),
        }
        messages, tools = CASES[1]
        text = tok.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False, **KW
        )
        ids = tok.encode(text, add_special_tokens=False)
        after_p50: dict[str, list[float]] = {}
        with httpx.Client(timeout=60) as http:
            for engine, direct, _, _ in arms.values():
                for _ in range(5):  # warm both paths
                    direct(http, engine, ids)
            print(f"gateway CPU per session creation, ms ({args.calls} each)")
            for r in range(args.rounds):
                for name, (engine, direct, gw, pid) in arms.items():
                    idle = [_create(http, gw, pid) for _ in range(args.calls)]
                    after = []
                    for _ in range(args.calls):
                        direct(http, engine, ids)
                        after.append(_create(http, gw, pid))
                    after_p50.setdefault(name, []).append(statistics.median(after))
                    cells = [
                        f"p50 {statistics.median(xs):.3f} mean {statistics.mean(xs):.3f}"
                        for xs in (idle, after)
                    ]
                    print(f"  round {r} {name:12s} engine idle: {cells[0]}; right after a reply: {cells[1]}")
        v, e = (statistics.mean(after_p50[k]) for k in arms)
        print(f"right after a reply, vLLM / embedded p50: {v / e:.2f}x ({v - e:+.3f} ms)")
        print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


def _create(http: httpx.Client, gw: str, pid: int) -> float:
    """The gateway's CPU, in ms, for one session creation."""
    before = cpu_seconds(pid)
    http.post(gw + "/v1/sessions", json={"task_id": "after-reply"}).raise_for_status()
    return (cpu_seconds(pid) - before) * 1000


if __name__ == "__main__":
    main()
