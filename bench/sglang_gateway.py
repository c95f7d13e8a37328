"""Added latency of the gateway per turn in front of the real SGLang, beside the embedded engine's (issue 35).

Starts SGLang 0.5.23 on CPU (tests/support/sglang_env.py, built by `python -m tests.support.sglang_env`)
and the embedded engine (`rlgw engine`) on the tiny Qwen3 fixture, side by side, with `rlgw serve` in
front of each. How a round is sent and timed (engines in blocks of rounds, direct and gateway legs
alternated, the gateway's own clocks): `bench/turn_legs.py`.

Prints SGLang's start-up, p50/p99 of each leg and of the added time, the gateway's CPU per turn, where a
turn's time went by the gateway's own clocks, the rounds whose legs generated a different number of tokens
(0 when like for like), the load average, and SGLang's added p50 against the embedded engine's (the
reference): the gap, the ratio, and rlgw's p99 against direct's.

    python -m bench.sglang_gateway [--rounds 60]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

from transformers import AutoTokenizer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.turn_legs import Arm, Engine, gateway, report, run, sglang_generate  # noqa: E402
from tests.support.procs import FIXTURES, engine_server  # noqa: E402
from tests.support.sglang_env import SGLANG_VERSION, sglang_server  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=60, help="turns sent each way")
    args = ap.parse_args()
    model = FIXTURES / "tiny-qwen3"
    tok = AutoTokenizer.from_pretrained(model)
    sglang_name = f"SGLang {SGLANG_VERSION}"
    with tempfile.TemporaryDirectory() as tmp_dir, contextlib.ExitStack() as stack:
        tmp = Path(tmp_dir)
        started = time.monotonic()
        sglang = stack.enter_context(sglang_server(model, log=tmp / "sglang.log"))
        startup = time.monotonic() - started
        embedded = stack.enter_context(engine_server(model))
        engines = {
            sglang_name: Engine(sglang, sglang_generate),
            "embedded": Engine(embedded, sglang_generate),
        }
        arms = {
            sglang_name: Arm(sglang_name, *stack.enter_context(gateway(sglang, "sglang", tmp))),
            "embedded": Arm("embedded", *stack.enter_context(gateway(embedded, "sglang", tmp))),
        }
        legs = run(engines, arms, tok, args.rounds)
    print(f"{sglang_name} (CPU) and the embedded engine, tiny-qwen3, {args.rounds} turns each way;")
    print(f"  SGLang start-up {startup:.0f} s")
    report(legs, arms, reference="embedded")


if __name__ == "__main__":
    main()
