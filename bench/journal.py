"""The session journal's cost per committed turn (issues: crash-safe sessions; 28, PostgreSQL).

Writes the record of an agent turn (an ~800-token tool result rendered as the increment, a
60-token reply, the new messages' digests) the way `turn.commit` does, `--turns` times, with
each journal (local files; PostgreSQL) and its two durability settings, and prints p50/p99 of
the time the turn waits for it (the await, thread hop and round trip included), the mean write
as the journal counts it, and the p50's ratio to the local journal's `normal`.

PostgreSQL: `--pg-url` names a database; by default a throwaway cluster on this machine (loopback
TCP, fsync on, as a production server; `tests/support/postgres.py`) is started and removed.

    python -m bench.journal --turns 400
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

from rlgw.gateway.sessions.journals import open_journal


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


async def _run(location: str | None, sync: str, turns: int) -> tuple[list[float], float]:
    with tempfile.TemporaryDirectory() as d:
        journal = open_journal(location, Path(d), sync=sync)
        sid = f"s-bench-{sync}"
        await journal.opened(sid, {"id": sid}, b"\0" * 32)
        waits = []
        for i in range(turns):
            t = time.perf_counter()
            await journal.turn(sid, _record(i))
            waits.append((time.perf_counter() - t) * 1000)
        write_ms = journal.write_seconds / journal.writes * 1000
        await journal.closed(sid)
        journal.close()
        return waits, write_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=400)
    ap.add_argument("--pg-url", help="a PostgreSQL database (default: a throwaway cluster; none: skipped)")
    ap.add_argument("--no-pg", action="store_true", help="the local journal only")
    args = ap.parse_args()
    with contextlib.ExitStack() as stack:
        journals: list[tuple[str, str | None]] = [("files", None)]
        if not args.no_pg:
            url = args.pg_url
            if url is None:
                from tests.support.postgres import cluster

                url = stack.enter_context(cluster(durable=True)).url()
            journals.append(("postgresql", url))
        print(
            f"{'journal':<12}{'sync':<8}{'p50 ms':>10}{'p99 ms':>10}{'write mean ms':>16}{'p50 / files':>13}"
        )
        base = None
        for name, location in journals:
            for sync in ("normal", "full"):
                waits, write_ms = asyncio.run(_run(location, sync, args.turns))
                p50, p99 = statistics.median(waits), statistics.quantiles(waits, n=100)[98]
                base = base or p50
                print(f"{name:<12}{sync:<8}{p50:>10.3f}{p99:>10.3f}{write_ms:>16.3f}{p50 / base:>11.1f}")


if __name__ == "__main__":
    main()
