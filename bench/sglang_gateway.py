"""Added latency of the gateway per turn in front of the real SGLang, beside the embedded engine's (issue 35).

Starts each engine on the tiny Qwen3 fixture in turn (the embedded engine, then SGLang 0.5.23 on CPU:
tests/support/sglang_env.py, built by `python -m tests.support.sglang_env`), with `rlgw serve` in front
of it. Each round sends one chat turn (greedy, a fresh capture session, tools on or off) two ways, in
alternating order:

- **direct**: the engine's `/generate` with the token ids of the template's render (the ids the gateway
  sends: tests/sglang checks that they are equal), the same sampling, logprobs on as the gateway asks;
- **rlgw**: the OpenAI SDK's chat call through the gateway (render, tokenize, generate, parse, record).

Both generate the same tokens (greedy), so added = rlgw - direct of the same round; each round checks
it (the token counts of the two legs). Prints each engine's start-up, p50/p99 of each leg and of the
added time, the rounds whose legs differed (0 when like for like), the ratio of SGLang's added p50 to
the embedded engine's (the reference), and the load average (the figures are only as quiet as the
machine).

    python -m bench.sglang_gateway [--rounds 60]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
from transformers import AutoTokenizer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.support import fixture_prompts as fp  # noqa: E402
from tests.support.procs import FIXTURES, engine_server, free_port, rlgw_process  # noqa: E402
from tests.support.sglang_env import SGLANG_VERSION, sglang_server  # noqa: E402

CASES = [(fp.PLAIN, None), (fp.WEATHER, fp.TOOLS), (fp.AFTER_TOOL, fp.TOOLS)]
KW = {"enable_thinking": False}


def _pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=60, help="turns sent each way, per engine")
    args = ap.parse_args()
    model = FIXTURES / "tiny-qwen3"
    tok = AutoTokenizer.from_pretrained(model)
    added_p50: dict[str, float] = {}
    print(f"tiny-qwen3, {args.rounds} turns each way per engine, greedy, up to 64 tokens")
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        engines: dict[str, Callable[[], contextlib.AbstractContextManager[str]]] = {
            "embedded": lambda: engine_server(model),
            f"SGLang {SGLANG_VERSION}": lambda: sglang_server(model, log=tmp / "sglang.log"),
        }
        for name, start in engines.items():
            started = time.monotonic()
            with start() as engine, _gateway(engine, tmp / name) as gw:
                startup = time.monotonic() - started
                direct, rlgw, unequal = run(gw, engine, tok, args.rounds)
            added = [g - d for g, d in zip(rlgw, direct, strict=True)]
            added_p50[name] = statistics.median(added)
            print(f"{name}: start-up (engine and gateway to /health 200) {startup:.0f} s")
            for leg, xs in (("direct", direct), ("rlgw", rlgw), ("added", added)):
                print(f"  {leg:7s} p50 {statistics.median(xs):7.2f} ms   p99 {_pct(xs, 0.99):7.2f} ms")
            print(f"  rounds whose legs generated a different number of tokens: {unequal}")
            print(f"  rlgw/direct p50 ratio {statistics.median(rlgw) / statistics.median(direct):.2f}")
    embedded, sglang = added_p50.values()
    print(f"added p50, SGLang / embedded (the reference): {sglang / embedded:.2f}")
    print(f"load average {os.getloadavg()[0]:.1f}")


@contextlib.contextmanager
def _gateway(engine: str, data: Path) -> Iterator[str]:
    port = free_port()
    args = ["--log-level", "warning", "serve", "--engine-url", engine, "--port", str(port)]
    with rlgw_process([*args, "--data-dir", str(data)], "/health", port) as gw:
        yield gw


def _ms(call: Callable[[], int]) -> tuple[float, int]:
    """The call's wall time in ms, and what it returned (the number of tokens generated)."""
    t = time.perf_counter()
    n = call()
    return (time.perf_counter() - t) * 1000, n


def _generate(http: httpx.Client, engine: str, body: dict[str, Any]) -> int:
    r = http.post(engine + "/generate", json=body)
    r.raise_for_status()
    return len(r.json()["output_ids"])


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
                "input_ids": ids,
                "sampling_params": {"temperature": 0.0, "max_new_tokens": 64},
                "return_logprob": True,
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
