"""Which PostgreSQL driver for the store and journal: asyncpg or psycopg 3 (issue 28, part 6).

The journal's hot path is one small autocommit INSERT per turn (a ~6 KB record as `bytea`);
this times it `--n` times, one after another, with asyncpg (async, binary protocol), psycopg 3's
async connection, and psycopg 3's sync connection behind a thread hop (how `pg_journal.py` runs it,
so that the same connections also serve sync callers such as the CLI). Prints p50/p99 per
insert and the ratio to asyncpg. Starts a throwaway cluster unless `--url` names a database.
asyncpg is only this comparison's: `pip install asyncpg` first (rlgw does not depend on it).

    python -m bench.pg_driver --n 2000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import Awaitable, Callable

DDL = "CREATE TABLE IF NOT EXISTS bench_turns (seq BIGSERIAL PRIMARY KEY, session TEXT, doc BYTEA)"
INSERT_PG = "INSERT INTO bench_turns (session, doc) VALUES (%s, %s)"  # psycopg's placeholders
INSERT_ASYNCPG = "INSERT INTO bench_turns (session, doc) VALUES ($1, $2)"
PAYLOAD = os.urandom(6000)


async def _time(n: int, op: Callable[[], Awaitable[object]]) -> list[float]:
    for _ in range(50):  # warm-up: connection caches, prepared statements
        await op()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await op()
        out.append((time.perf_counter() - t) * 1e6)
    return out


async def _asyncpg(url: str, n: int) -> list[float]:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        return await _time(n, lambda: conn.execute(INSERT_ASYNCPG, "s", PAYLOAD))
    finally:
        await conn.close()


async def _psycopg_async(url: str, n: int) -> list[float]:
    import psycopg

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    try:
        return await _time(n, lambda: conn.execute(INSERT_PG, ("s", PAYLOAD)))
    finally:
        await conn.close()


async def _psycopg_thread(url: str, n: int) -> list[float]:
    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    loop = asyncio.get_running_loop()

    def insert() -> None:
        conn.execute(INSERT_PG, ("s", PAYLOAD))

    try:
        return await _time(n, lambda: loop.run_in_executor(None, insert))
    finally:
        conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--url", help="a database to use (default: a throwaway cluster)")
    args = ap.parse_args()
    with contextlib.ExitStack() as stack:
        url = args.url
        if url is None:
            from tests.support.postgres import cluster

            url = stack.enter_context(cluster()).url()
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(DDL)
        runs = {
            "asyncpg": _asyncpg,
            "psycopg async": _psycopg_async,
            "psycopg sync + thread": _psycopg_thread,
        }
        print(f"{'driver':<24}{'p50 us':>10}{'p99 us':>10}{'vs asyncpg p50':>16}")
        base = None
        for name, run in runs.items():
            us = asyncio.run(run(url, args.n))
            p50, p99 = statistics.median(us), statistics.quantiles(us, n=100)[98]
            base = base or p50
            print(f"{name:<24}{p50:>10.0f}{p99:>10.0f}{p50 / base:>16.2f}")


if __name__ == "__main__":
    main()
