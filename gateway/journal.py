"""The session journal: every open session and every committed turn, durable before the agent
gets its answer, so a gateway killed mid-rollout restarts with its sessions as they were.

One SQLite database in the data dir (`journal.sqlite3`, WAL), two tables: `sessions` (one row
per open session: its settings and its key's SHA-256 digest, never the key) and `turns` (one
row per committed turn, in order: what the turn did to the ledger). A turn row is written
before the turn is applied and answered; a turn still generating when the process dies has no
row and is simply absent (the agent's retry regenerates it). `finish` and `delete` remove a
session's rows once its samples are in the store (or it is gone), so the journal holds open
sessions only.

Durability: `normal` (the default) survives a killed process, which is what a `kill -9` or an
OOM kill is: every row is in the OS's cache before the turn is answered, and nothing is
fsynced, not even checkpoints (after a power loss the journal may be lost or unreadable, and
start-up fails on it). `full` also survives power loss, at the cost of an fsync per turn.
Several gateways on one host may share a data dir: a gateway asked for a session it does not
hold restores it from here (`load`).

With `normal` a write is a WAL append with no fsync (tens of microseconds) and runs inline;
with `full` writes (and the checkpoints in them) run on one dedicated thread so the event loop
never waits on an fsync. This module knows the ledger's records, not HTTP or the engine.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from rlgw.gateway.metrics import JOURNAL_WRITE_SECONDS

FILENAME = "journal.sqlite3"
CHECKPOINT_PAGES = 256  # "normal": a checkpoint (no fsync) every 1 MiB of WAL


@dataclass(slots=True)
class JournaledSession:
    """One open session as the journal holds it: its settings, key digest and turn records."""

    doc: dict[str, Any]
    key_digest: bytes
    turns: list[dict[str, Any]]


class SessionJournal:
    """Append-only journal of open sessions and their committed turns (see the module docstring)."""

    def __init__(self, path: Path, *, sync: str = "normal") -> None:
        if sync not in ("normal", "full"):
            raise ValueError("journal sync must be 'normal' or 'full'")
        self.path = path
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA busy_timeout=10000")
        if sync == "normal":
            # A killed process loses nothing the OS holds: no fsync, checkpoints included, and
            # small checkpoints (about 60 turns of rows, a fraction of a millisecond) in the
            # write that crosses them. One with an fsync stalled the loop for milliseconds; one
            # on another thread raced the writes and never finished, and the WAL only grew.
            self._conn.execute("PRAGMA synchronous=OFF")
            self._conn.execute(f"PRAGMA wal_autocheckpoint={CHECKPOINT_PAGES}")
        else:
            self._conn.execute("PRAGMA synchronous=FULL")  # every write and checkpoint on the writer thread
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, doc BLOB NOT NULL, key BLOB NOT NULL)"
        )
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS turns (seq INTEGER PRIMARY KEY, "
            "session TEXT NOT NULL, doc BLOB NOT NULL)"
        )
        self._conn.execute("CREATE INDEX IF NOT EXISTS turns_by_session ON turns (session, seq)")
        self._conn.execute("CREATE INDEX IF NOT EXISTS sessions_by_key ON sessions (key)")
        self._lock = threading.Lock()
        self._inline = sync == "normal"  # an fsync per write ("full") goes to the writer thread
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlgw-journal")
        self.write_seconds = 0.0  # total time spent writing (for the metrics)
        self.writes = 0

    @classmethod
    def open(cls, data_dir: Path, *, sync: str = "normal") -> SessionJournal:
        """The journal of `data_dir` (created if missing)."""
        data_dir.mkdir(parents=True, exist_ok=True)
        return cls(data_dir / FILENAME, sync=sync)

    def _execute(self, sql: str, args: tuple[Any, ...]) -> None:
        started = time.perf_counter()
        self._conn.execute(sql, args)
        elapsed = time.perf_counter() - started
        self.write_seconds += elapsed
        self.writes += 1
        JOURNAL_WRITE_SECONDS.observe(elapsed)

    def _run(self, sql: str, args: tuple[Any, ...]) -> None:
        with self._lock:
            self._execute(sql, args)

    async def _write(self, sql: str, args: tuple[Any, ...]) -> None:
        if self._inline:
            # Without an fsync a WAL append is tens of microseconds: cheaper on the loop than the
            # hand-off to a thread and back (measured with bench/journal.py).
            self._run(sql, args)
            return
        loop = asyncio.get_running_loop()
        # Shielded: a turn whose client leaves while its row is being written still gets the row
        # (the turn is then applied; a retry replaces it), never half of one.
        await asyncio.shield(loop.run_in_executor(self._writer, self._run, sql, args))

    async def opened(self, session_id: str, doc: dict[str, Any], key_digest: bytes) -> None:
        """Record a new session (before its id and key are handed out)."""
        await self._write(
            "INSERT OR REPLACE INTO sessions (id, doc, key) VALUES (?, ?, ?)",
            (session_id, orjson.dumps(doc), key_digest),
        )

    async def turn(self, session_id: str, record: dict[str, Any]) -> None:
        """Record one committed turn of `session_id`."""
        await self._write(
            "INSERT INTO turns (session, doc) VALUES (?, ?)",
            (session_id, orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY)),
        )

    async def closed(self, session_id: str) -> None:
        """Forget a session (finished and stored, deleted, or expired)."""
        await self._write("DELETE FROM turns WHERE session = ?", (session_id,))
        await self._write("DELETE FROM sessions WHERE id = ?", (session_id,))

    def forget(self, session_id: str) -> None:
        """`closed`, blocking (at start-up, before the loop serves anything)."""
        self._run("DELETE FROM turns WHERE session = ?", (session_id,))
        self._run("DELETE FROM sessions WHERE id = ?", (session_id,))

    def load(self, session_id: str) -> JournaledSession | None:
        """One open session, or None (blocking: a few milliseconds; used on a miss)."""
        with self._lock:
            row = self._conn.execute("SELECT doc, key FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if row is None:
                return None
            turns = self._conn.execute("SELECT doc FROM turns WHERE session = ? ORDER BY seq", (session_id,))
            return JournaledSession(orjson.loads(row[0]), bytes(row[1]), [orjson.loads(t[0]) for t in turns])

    def session_for_key(self, key_digest: bytes) -> str | None:
        """The id of the open session whose key has this digest, or None."""
        with self._lock:
            row = self._conn.execute("SELECT id FROM sessions WHERE key = ?", (key_digest,)).fetchone()
        return row[0] if row else None

    def session_ids(self) -> list[str]:
        """The ids of the open sessions, oldest first."""
        with self._lock:
            return [r[0] for r in self._conn.execute("SELECT id FROM sessions ORDER BY rowid")]

    def load_all(self) -> list[JournaledSession]:
        """Every open session, oldest first (at start-up)."""
        return [s for s in (self.load(i) for i in self.session_ids()) if s is not None]

    def close(self) -> None:
        """Finish pending writes and close the database."""
        self._writer.shutdown(wait=True)
        with self._lock:
            self._conn.close()
