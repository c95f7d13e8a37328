"""The session journal on PostgreSQL: open sessions and their committed turns shared by a fleet of
gateways, so that any gateway restores any open session on its first call.

The same interface as `journal.SessionJournal` (the local files) and the same records, stored
opaquely: a session's settings document and key digest in `rlgw.sessions`, and each committed
turn's record as the very bytes the file journal frames (`orjson` of the record) in
`rlgw.turns`, in commit order per session. The journal does not read the records; the session
table that replays them does, so a change of their contents needs no change here.

A turn's row is committed before the turn is answered (as a file journal's frame is written).
Durability follows `--journal-sync`: `normal` commits with `synchronous_commit = off` (the
gateway's kill loses nothing: the row is in the server once the commit returns; a crash of the
database server itself may lose its last fraction of a second), `full` waits for the server's
WAL flush. Writes run on a few threads with a connection each, so turns of different sessions
commit in parallel; a session's turns are serialized by its lock upstream, which is what
orders them. A lost connection makes that call raise `StoreUnavailable` (503) and is reopened
on the next one.

It knows no HTTP, no ledger and no engine.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from rlgw.gateway.errors import SessionMoved
from rlgw.gateway.metrics import JOURNAL_WRITE_SECONDS
from rlgw.gateway.sessions.journal import JournaledSession
from rlgw.gateway.trajectories.pg_store import PG_SCHEMA, SEARCH_PATH, Link, psycopg_module

WRITERS = 4  # connections writing turns at once (one per thread)

SCHEMA = f"""
CREATE SCHEMA IF NOT EXISTS {PG_SCHEMA};
{SEARCH_PATH};
CREATE TABLE IF NOT EXISTS sessions (
    seq BIGSERIAL UNIQUE, id TEXT PRIMARY KEY, doc BYTEA NOT NULL, key BYTEA NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_by_key ON sessions (key);
CREATE TABLE IF NOT EXISTS turns (
    seq BIGSERIAL PRIMARY KEY, session TEXT NOT NULL, doc BYTEA NOT NULL
);
CREATE INDEX IF NOT EXISTS turns_by_session ON turns (session, seq);
ALTER TABLE turns ADD COLUMN IF NOT EXISTS n INTEGER;
CREATE UNIQUE INDEX IF NOT EXISTS turns_session_n ON turns (session, n);
"""


class PgSessionJournal:
    """Journal of open sessions and their committed turns in PostgreSQL (see the module docstring)."""

    shared = True  # a fleet's gateways all use it

    def __init__(self, url: str, *, sync: str = "normal") -> None:
        if sync not in ("normal", "full"):
            raise ValueError("journal sync must be 'normal' or 'full'")
        self.location = url
        commit = "off" if sync == "normal" else "on"
        self._setup = (SEARCH_PATH, f"SET synchronous_commit = {commit}")
        self._local = threading.local()
        self._links: list[Link] = []
        self._links_lock = threading.Lock()
        self._writer = ThreadPoolExecutor(WRITERS, thread_name_prefix="rlgw-pgjournal")
        self.write_seconds = 0.0  # total time turns spent writing their row (for the metrics)
        self.writes = 0
        self._closed = False
        self._link().run(self._create_schema)

    @classmethod
    def open(cls, url: str, *, sync: str = "normal") -> PgSessionJournal:
        """The journal in the database at `url` (tables created if missing)."""
        return cls(url, sync=sync)

    @staticmethod
    def _create_schema(conn: Any) -> None:
        conn.execute("SELECT pg_advisory_lock(hashtext('rlgw_journal_schema'))")
        try:
            conn.execute(SCHEMA)
        finally:
            conn.execute("SELECT pg_advisory_unlock(hashtext('rlgw_journal_schema'))")

    def _link(self) -> Link:
        """This thread's connection (one per thread: psycopg serializes a connection's users)."""
        link = getattr(self._local, "link", None)
        if link is None:
            link = self._local.link = Link(self.location, autocommit=True, setup=self._setup)
            with self._links_lock:
                self._links.append(link)
        return link

    def _exec(self, sql: str, args: tuple[Any, ...], *, idempotent: bool = True) -> list[tuple[Any, ...]]:
        """Run one statement (autocommit); all but a turn's insert may be repeated (`Link.run`)."""
        if self._closed:
            raise RuntimeError("the journal is closed")

        def run(conn: Any) -> list[tuple[Any, ...]]:
            cur = conn.execute(sql, args)
            return cur.fetchall() if cur.description is not None else []

        return self._link().run(run, idempotent=idempotent)

    async def _write(self, sql: str, args: tuple[Any, ...], *, idempotent: bool = True) -> None:
        if self._closed:
            raise RuntimeError("the journal is closed")
        loop = asyncio.get_running_loop()
        # Shielded: a turn whose client leaves while its row is being written still gets the row
        # (the turn is then applied; a retry replaces it), never a turn applied without one.
        work = functools.partial(self._exec, sql, args, idempotent=idempotent)
        await asyncio.shield(loop.run_in_executor(self._writer, work))

    async def opened(self, session_id: str, doc: dict[str, Any], key_digest: bytes) -> None:
        """Record a new session (before its id and key are handed out)."""
        await self._write(
            "INSERT INTO sessions (id, doc, key) VALUES (%s, %s, %s) "
            "ON CONFLICT (id) DO UPDATE SET doc = EXCLUDED.doc, key = EXCLUDED.key",
            (session_id, orjson.dumps(doc), key_digest),
        )

    async def turn(self, session_id: str, record: dict[str, Any], *, index: int | None = None) -> None:
        """Record one committed turn of `session_id` (the file journal's bytes, as they are).

        `index` is how many turns the writer's copy of the session holds: a row with that index
        already there means another gateway (or a write whose answer was lost) committed turns this
        copy lacks, so the copy is stale and `SessionMoved` is raised with nothing written.
        """
        payload = orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY)
        started = time.perf_counter()
        # Not repeated on a lost connection: it may have committed (the agent's retry replaces the turn).
        insert = "INSERT INTO turns (session, n, doc) VALUES (%s, %s, %s)"
        try:
            await self._write(insert, (session_id, index, payload), idempotent=False)
        except psycopg_module().errors.UniqueViolation as exc:
            raise SessionMoved(
                f"session {session_id!r} moved on: another gateway committed its turn {index}; retry"
            ) from exc
        elapsed = time.perf_counter() - started  # the turn's wait, thread hop and round trip included
        self.write_seconds += elapsed
        self.writes += 1
        JOURNAL_WRITE_SECONDS.observe(elapsed)

    async def closed(self, session_id: str) -> None:
        """Forget a session (finished and stored, deleted, or expired): its row and its turns."""
        loop = asyncio.get_running_loop()
        await asyncio.shield(loop.run_in_executor(self._writer, self.forget, session_id))

    def forget(self, session_id: str) -> None:
        """`closed`, blocking: one statement, so the row and its turns go together."""
        self._exec(
            "WITH gone AS (DELETE FROM sessions WHERE id = %s) DELETE FROM turns WHERE session = %s",
            (session_id, session_id),
        )

    def load(self, session_id: str) -> JournaledSession | None:
        """One open session, or None (blocking: used on a miss and at start-up)."""
        rows = self._exec("SELECT doc, key FROM sessions WHERE id = %s", (session_id,))
        if not rows:
            return None
        turns = self._exec("SELECT doc FROM turns WHERE session = %s ORDER BY seq", (session_id,))
        doc, key = rows[0]
        return JournaledSession(orjson.loads(doc), bytes(key), [orjson.loads(t) for (t,) in turns])

    def session_for_key(self, key_digest: bytes) -> str | None:
        """The id of the open session whose key has this digest, or None."""
        rows = self._exec("SELECT id FROM sessions WHERE key = %s", (key_digest,))
        return rows[0][0] if rows else None

    def session_ids(self) -> list[str]:
        """The ids of the open sessions, oldest first."""
        return [r[0] for r in self._exec("SELECT id FROM sessions ORDER BY seq", ())]

    def load_all(self) -> list[JournaledSession]:
        """Nothing, and removes turns whose session is gone: a shared journal's sessions are restored
        one at a time on their first call (`load`), never all at start-up, since other gateways
        may be serving them right now (a copy taken at start-up would be stale by its next call)."""
        self._exec(
            "DELETE FROM turns t WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = t.session)",
            (),
        )
        return []

    async def ready(self) -> None:
        """Raise unless the database answers (for /readyz)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._writer, self._exec, "SELECT 1 FROM sessions LIMIT 1", ())

    def close(self) -> None:
        """Finish pending writes and close the connections; later writes fail."""
        self._writer.shutdown(wait=True)
        self._closed = True
        with self._links_lock:
            for link in self._links:
                link.close()
