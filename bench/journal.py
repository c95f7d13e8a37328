"""The session journal's cost per committed turn (issue: crash-safe sessions).

Writes the record of an agent turn (an ~800-token tool result rendered as the increment, a
60-token reply, the new messages' digests) the way `turn.commit` does, `--turns` times, with the
journal's two durability settings, and prints p50/p99 of the time the turn waits for it (the
await, thread hop included) next to the time of the SQLite write alone.

    python bench/journal.py --turns 400
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from rlgw.gateway.sessions.journal import SessionJournal


def _record(i: int) -> dict:
    return {
        "invalidate": None,
        "context_exhausted": False,
        "version": "v1",
        "segment": None,
        "replace": False,
        "echo_matches": [],
        "echo_edits": [],
        "overridden": {},
        "commit": {
            # What the ledger keeps of the new messages: their digests.
            "new_messages": None,
            "records": [["tool", 0x9E3779B97F4A7C15 ^ i]],
            "prompt_ids": list(range(800)),
            "output_ids": list(range(60)),
            "logprobs": [-0.5] * 60,
            "version_spans": [],
            "response_id": f"chatcmpl-{i}",
            "tool_call_ids": [f"call_{i:024x}"],
            "content": "",
            "rid": f"rid-{i}",
            "finish_type": "stop",
            "ended_with_stop_token": True,
            "parse_errors": [],
            "agent_text": "",
            "surface": "chat",
            "tools": 1,
            "calls": [["run", '{"cmd":"ls"}']],
            "history": [2 * i + 2, 3400 * i + 2000, 0x51ED270B27C4B3D1 ^ i],
        },
    }


async def _run(sync: str, turns: int) -> tuple[list[float], float]:
    with tempfile.TemporaryDirectory() as d:
        journal = SessionJournal.open(Path(d), sync=sync)
        await journal.opened("s-bench", {"id": "s-bench"}, b"\0" * 32)
        waits = []
        for i in range(turns):
            t = time.perf_counter()
            await journal.turn("s-bench", _record(i))
            waits.append((time.perf_counter() - t) * 1000)
        write_ms = journal.write_seconds / journal.writes * 1000
        journal.close()
        return waits, write_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=400)
    args = ap.parse_args()
    print(f"{'sync':<8}{'p50 ms':>10}{'p99 ms':>10}{'write mean ms':>16}")
    for sync in ("normal", "full"):
        waits, write_ms = asyncio.run(_run(sync, args.turns))
        q = statistics.quantiles(waits, n=100)
        print(f"{sync:<8}{statistics.median(waits):>10.3f}{q[98]:>10.3f}{write_ms:>16.3f}")


if __name__ == "__main__":
    main()
