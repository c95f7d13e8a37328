"""One chat turn sent to engines directly and through `rlgw serve`, leg by leg: the measurement shared by
the added-latency benches (`bench/sglang_gateway.py`, `bench/vllm_gateway.py`).

Each round renders one of three chat cases (plain, tool call, after a tool result; greedy, up to 64 tokens)
and sends it every way:

- **direct**: the engine's own endpoint with the token ids of the template's render (the ids the gateway
  sends: the engine tiers' tests check that they are equal) and the same sampling;
- **rlgw**: the chat call through a gateway (render, tokenize, generate, parse, record) in a fresh capture
  session, sent by the same pooled HTTP client as the direct call. The OpenAI SDK's own 2-4 ms of CPU a
  call is the agent's with or without rlgw, and a fresh connection per one-turn session would put a TCP
  connect in every gateway leg and none in the direct ones.

Engines take turns in blocks of `BLOCK` rounds, so drift on the machine reaches every engine alike; within
a block an engine's direct leg and its gateways alternate in rotating order. The bench's garbage collection
runs between blocks, never inside a timed call. Each gateway leg also reads the gateway's own clocks from
its `/metrics` (`rlgw_turn_added_seconds`: the turn's wall time minus its engine waits;
`rlgw_engine_seconds`), so a turn's time splits into the gateway's own, its wait on the engine, and the
rest outside it (HTTP to the gateway, the client). Greedy, so the legs of a round generate the same tokens;
added = rlgw - direct of the same engine in the same round.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from transformers import AutoTokenizer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.gateway import cpu_seconds  # noqa: E402
from tests.support import fixture_prompts as fp  # noqa: E402
from tests.support.procs import FIXTURES, free_port, wait_healthy  # noqa: E402
from tests.support.vllm_env import build  # noqa: E402
from tests.support.wide_heads import widen_heads  # noqa: E402

CASES = [(fp.PLAIN, None), (fp.WEATHER, fp.TOOLS), (fp.AFTER_TOOL, fp.TOOLS)]
KW = {"enable_thinking": False}
WARM = 2  # rounds that warm every path up, not counted
BLOCK = 5  # rounds an engine serves before the next engine's turn

Direct = Callable[[httpx.Client, str, list[int]], int]


@dataclass(frozen=True)
class Engine:
    """An engine under test: its URL, its direct call, and how long to wait after its block (for an engine
    that keeps a core busy after a request, so the next engine's block starts without it)."""

    url: str
    direct: Direct
    settle_s: float = 0.0


@dataclass(frozen=True)
class Arm:
    """A gateway in front of one engine: the engine's name in `run`'s engines, its URL and pid."""

    engine: str
    url: str
    pid: int


def vllm_model(tmp: Path) -> tuple[Path, Any]:
    """vLLM's venv built where it is not (`python -m tests.support.vllm_env`), and tiny-qwen3 with 64-wide
    heads (vLLM's CPU attention refuses 16; the same function) written to `tmp`, with its tokenizer."""
    build()
    model = widen_heads(FIXTURES / "tiny-qwen3", tmp / "tiny-qwen3-hd64")
    return model, AutoTokenizer.from_pretrained(model)


def sglang_generate(http: httpx.Client, engine: str, ids: list[int]) -> int:
    """SGLang's (and the embedded engine's) `/generate`, logprobs on as the gateway asks; tokens made."""
    sampling = {"temperature": 0.0, "max_new_tokens": 64}
    body = {"input_ids": ids, "sampling_params": sampling, "return_logprob": True}
    r = http.post(engine + "/generate", json=body)
    r.raise_for_status()
    return len(r.json()["output_ids"])


def vllm_generate(http: httpx.Client, engine: str, ids: list[int]) -> int:
    """vLLM's tokens-in `/inference/v1/generate`, ids out, as the gateway asks; tokens made."""
    sampling = {"temperature": 0.0, "max_tokens": 64, "logprobs": 0}
    body = {"token_ids": ids, "sampling_params": sampling, "output_mode": "tokens"}
    r = http.post(engine + "/inference/v1/generate", json=body)
    r.raise_for_status()
    return len(r.json()["choices"][0]["token_ids"])


@contextlib.contextmanager
def gateway(engine: str, kind: str, tmp: Path, code: Path = REPO) -> Iterator[tuple[str, int]]:
    """`rlgw serve` of the code in `code` in front of `engine`; yields its URL and pid."""
    port = free_port()
    args = ["--log-level", "warning", "serve", "--engine-url", engine, "--engine-kind", kind]
    args += ["--port", str(port), "--data-dir", str(tempfile.mkdtemp(dir=tmp))]
    env = {**os.environ, "PYTHONPATH": str(code)}
    log_path = tmp / f"gateway-{port}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlgw.bin.main", *args], cwd=code, env=env, stdout=log, stderr=log
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url + "/health", proc, log=log_path)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def run(engines: dict[str, Engine], arms: dict[str, Arm], tok: Any, rounds: int) -> dict[str, list[float]]:
    """Every leg's time per round in ms (`direct <engine>`, `rlgw <arm>`); per gateway turn the gateway's
    CPU (`cpu <arm>`), its own time and its engine wait by its clocks (`own <arm>`, `engine <arm>`); and per
    round whether its legs generated different numbers of tokens (`unequal`)."""
    out: dict[str, list[float]] = {}
    counts: dict[int, set[int]] = {}
    total = rounds + WARM
    gc.disable()
    try:
        with httpx.Client(timeout=120) as http:
            for block, first in enumerate(range(0, total, BLOCK)):
                order = list(engines)
                order = order[block % len(order) :] + order[: block % len(order)]
                for name in order:
                    # Sessions open before the block's calls, as an agent's opens before its first turn.
                    calls = {
                        i: _legs(http, tok, name, engines[name], arms, i)
                        for i in range(first, min(first + BLOCK, total))
                    }
                    for i, legs in calls.items():
                        for leg, (arm, call) in legs.items():
                            n = _timed(http, leg, arm, call, out if i >= WARM else {})
                            counts.setdefault(i, set()).add(n)
                    time.sleep(engines[name].settle_s)
                    gc.collect()
    finally:
        gc.enable()
    out["unequal"] = [float(len(counts[i]) > 1) for i in range(WARM, total)]
    return out


def _timed(http: httpx.Client, leg: str, arm: Arm | None, call: Callable[[], int], out: dict) -> int:
    """Run one leg, adding its figures to `out`; returns the number of tokens it generated."""
    clocks = _gateway_clocks(http, arm.url) if arm else (0.0, 0.0, 0.0)
    cpu = cpu_seconds(arm.pid) if arm else 0.0
    started = time.perf_counter()
    n = call()
    out.setdefault(leg, []).append((time.perf_counter() - started) * 1000)
    if arm:
        name = leg.removeprefix("rlgw ")
        out.setdefault(f"cpu {name}", []).append((cpu_seconds(arm.pid) - cpu) * 1000)
        after = _settled(http, arm.url, clocks)
        out.setdefault(f"own {name}", []).append((after[0] - clocks[0]) * 1000)
        out.setdefault(f"engine {name}", []).append((after[1] - clocks[1]) * 1000)
    return n


def _legs(
    http: httpx.Client, tok: Any, name: str, engine: Engine, arms: dict[str, Arm], i: int
) -> dict[str, tuple[Arm | None, Callable[[], int]]]:
    """Round `i`'s calls of engine `name`, in rotating order: its direct call and one chat turn through
    each gateway in front of it (a fresh session each), with the gateway (None for direct)."""
    messages, tools = CASES[i % len(CASES)]
    extra = {"tools": tools} if tools else {}
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **extra, **KW)
    ids = tok.encode(text, add_special_tokens=False)
    legs: dict[str, tuple[Arm | None, Callable[[], int]]] = {
        f"direct {name}": (None, functools.partial(engine.direct, http, engine.url, ids))
    }
    for label, arm in arms.items():
        if arm.engine != name:
            continue
        session = {"task_id": "bench", "sampling": {"temperature": 0.0}}
        s = http.post(arm.url + "/v1/sessions", json=session).json()
        body = {"model": "m", "messages": messages, "max_tokens": 64, "chat_template_kwargs": KW, **extra}
        legs[f"rlgw {label}"] = (arm, functools.partial(_chat, http, s, body))
    names = list(legs)
    return {k: legs[k] for k in names[i % len(names) :] + names[: i % len(names)]}


def _chat(http: httpx.Client, session: dict[str, str], body: dict[str, Any]) -> int:
    headers = {"Authorization": f"Bearer {session['api_key']}"}
    r = http.post(session["base_url"] + "/chat/completions", json=body, headers=headers)
    r.raise_for_status()
    return r.json()["usage"]["completion_tokens"]


def _gateway_clocks(http: httpx.Client, gw: str) -> tuple[float, float, float]:
    """The gateway's running totals of its own time in turns and of its turns' engine waits, in seconds,
    and its count of turns (`rlgw_turn_added_seconds`, `rlgw_engine_seconds` on its `/metrics`)."""
    totals = {
        "rlgw_turn_added_seconds_sum": 0.0,
        "rlgw_engine_seconds_sum": 0.0,
        "rlgw_engine_seconds_count": 0.0,
    }
    for line in http.get(gw + "/metrics").text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    own, engine, turns = totals.values()
    return own, engine, turns


def _settled(http: httpx.Client, gw: str, before: tuple[float, float, float]) -> tuple[float, float, float]:
    """The gateway's clocks once they count the turn just answered (it counts it as the response ends)."""
    for _ in range(100):
        after = _gateway_clocks(http, gw)
        if after[2] > before[2]:
            return after
        time.sleep(0.005)
    raise RuntimeError(f"{gw}/metrics never counted the turn")


def pct(xs: list[float], q: float) -> float:
    """The `q` quantile of `xs` (nearest rank)."""
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


def report(legs: dict[str, list[float]], arms: dict[str, Arm], reference: str) -> None:
    """Print each arm's legs, where its turns' time went, and the goal against the `reference` arm:
    added p50 within 0.5 ms of the reference's, rlgw p99 within 5 ms of direct's."""
    print(f"  load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"  {'':34s} {'direct p50/p99':>17s} {'rlgw p50/p99':>17s} {'added p50/p99':>17s} gw CPU/turn")
    added: dict[str, list[float]] = {}
    for label, arm in arms.items():
        direct, through = legs[f"direct {arm.engine}"], legs[f"rlgw {label}"]
        added[label] = [t - d for t, d in zip(through, direct, strict=True)]
        cells = [
            f"{statistics.median(xs):7.2f} {pct(xs, 0.99):7.2f} ms" for xs in (direct, through, added[label])
        ]
        print(f"  {label:34s} {' '.join(cells)} {statistics.mean(legs[f'cpu {label}']):5.2f} ms")
    print("  where a turn's time goes (the gateway's own clocks, from its /metrics):")
    print(f"  {'':34s} {'gateway own p50/p99':>19s} {'engine wait p50/p99':>19s} {'outside p50/p99':>19s}")
    for label in arms:
        own, wait = legs[f"own {label}"], legs[f"engine {label}"]
        outside = [t - o - w for t, o, w in zip(legs[f"rlgw {label}"], own, wait, strict=True)]
        cells = [f"{statistics.median(xs):7.2f} {pct(xs, 0.99):7.2f} ms" for xs in (own, wait, outside)]
        print(f"  {label:34s} {'  '.join(cells)}")
    print(f"  rounds whose legs generated a different number of tokens: {int(sum(legs['unequal']))}")
    print(f"  goal: added p50 within 0.5 ms of {reference}'s, rlgw p99 within 5 ms of direct's")
    base = statistics.median(added[reference])
    for label, arm in arms.items():
        if label == reference:
            continue
        gap = statistics.median(added[label]) - base
        tail = pct(legs[f"rlgw {label}"], 0.99) - pct(legs[f"direct {arm.engine}"], 0.99)
        verdict = "met" if gap <= 0.5 and tail <= 5 else "not met"
        ratio = statistics.median(added[label]) / base
        figures = f"p50 gap {gap:+6.2f} ms ({ratio:.2f}x), p99 over direct {tail:+6.2f} ms"
        print(f"    {label:34s} {figures}: {verdict}")
