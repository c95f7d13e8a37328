"""The trajectory store on PostgreSQL: one stream of samples for a fleet of gateways.

The same interface and row format as `store.TrajectoryStore` (SQLite): one row per sample, the
token arrays as the same zstd frame (`bytea`), weight versions and metadata as the same JSON
bytes, and the summary columns (status, reward, lengths, task) as indexed columns; tenant
scoping on every read; group commit of the finishes that arrive while a commit is in flight.

The cursor is commit-ordered, which a sequence is not: two gateways that take ids 7 and 8 from
a sequence may commit 8 first, and a reader that saw 8 and then asks for "after 8" never sees
7. Here a transaction takes its cursors from a one-row counter (`UPDATE ... RETURNING`), whose
row lock it holds until it commits, so the next writer gets larger cursors only after this one
is committed and visible: a reader that sees cursor c has already been able to see every
cursor below c. Writers from all gateways serialize on that row for the few statements of a
commit (`tests/gateway/trajectories/test_pg_cursor.py` shows a BIGSERIAL cursor skipping a row and this
one not).

The long poll is woken by `LISTEN`/`NOTIFY`: every commit notifies its tenants (delivered at
commit, so never before the rows are visible), and a listener thread wakes that tenant's
waiters in every process. No timer: a waiter sleeps until a notification or its timeout.

It does not own HTTP, validation or sessions, as for `store.py`. Database work runs on
dedicated threads with their own connections (psycopg 3, sync API, so that the CLI's sync
reads work without an event loop); a lost connection is reopened on the next use, and the
failing call raises `StoreUnavailable` (503) meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import select
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from rlgw.gateway.errors import StoreUnavailable
from rlgw.gateway.trajectories.store import (
    ROLLOUT_DOC,
    SCHEMA_VERSION,
    Finish,
    GroupCommitStore,
    PendingFinish,
    StoreError,
    refuse_stored_rollout,
)

log = logging.getLogger(__name__)

CHANNEL = "samples"
_T = TypeVar("_T")

# rlgw's tables live in their own schema (every connection sets `search_path`), under the names
# the SQLite store uses, so both backends share their reads' SQL.
PG_SCHEMA = "rlgw"
SEARCH_PATH = f"SET search_path TO {PG_SCHEMA}"
SCHEMA = f"""
CREATE SCHEMA IF NOT EXISTS {PG_SCHEMA};
{SEARCH_PATH};
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS commit_counter (
    one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one), last BIGINT NOT NULL
);
INSERT INTO commit_counter (one, last) VALUES (TRUE, 0) ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS samples (
    cursor BIGINT PRIMARY KEY,
    tenant TEXT NOT NULL,
    session_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    segment INTEGER NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    rollout_id TEXT NOT NULL,
    group_index INTEGER NOT NULL,
    status TEXT NOT NULL,
    reward DOUBLE PRECISION,
    response_length INTEGER NOT NULL,
    trainable_tokens INTEGER NOT NULL,
    arrays BYTEA NOT NULL,
    weight_versions BYTEA NOT NULL,
    metadata BYTEA NOT NULL
);
CREATE INDEX IF NOT EXISTS samples_by_tenant ON samples (tenant, cursor);
CREATE INDEX IF NOT EXISTS samples_by_session ON samples (session_id);
CREATE INDEX IF NOT EXISTS samples_by_task ON samples (tenant, task_id, cursor);
CREATE INDEX IF NOT EXISTS samples_by_status ON samples (tenant, status, cursor);
CREATE INDEX IF NOT EXISTS samples_by_reward ON samples (tenant, reward);
CREATE TABLE IF NOT EXISTS outcomes (
    session_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, doc BYTEA NOT NULL
);
ALTER TABLE outcomes ADD COLUMN IF NOT EXISTS rollout_id TEXT;
CREATE INDEX IF NOT EXISTS outcomes_by_rollout ON outcomes (tenant, rollout_id);
"""

_INSERT = (
    "INSERT INTO samples (cursor, tenant, session_id, task_id, segment, created_at, rollout_id, "
    "group_index, status, reward, response_length, trainable_tokens, arrays, weight_versions, metadata) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
_ROLLOUT_DOC = ROLLOUT_DOC.replace("?", "%s")


def is_url(location: str) -> bool:
    """Whether a `--store`/`--journal` value names a PostgreSQL database rather than a path."""
    return location.startswith(("postgresql://", "postgres://"))


def psycopg_module() -> Any:
    """psycopg 3, or a clear error naming the extra that installs it (the base install has no driver)."""
    try:
        import psycopg
    except ImportError as exc:
        raise StoreError(
            "a postgresql:// store or journal needs psycopg 3: pip install 'rlgw[postgres]'"
        ) from exc
    return psycopg


class Link:
    """One connection, reopened on the next use after it broke (a PostgreSQL restart, a network cut).

    Used from one thread at a time. `run` turns a lost connection into `StoreUnavailable`.
    """

    def __init__(self, url: str, *, autocommit: bool, setup: tuple[str, ...] = ()) -> None:
        self.url = url
        self._autocommit = autocommit
        self._setup = setup
        self._conn: Any = None

    def conn(self) -> Any:
        """The open connection (opened now if there is none or it broke)."""
        psycopg = psycopg_module()
        if self._conn is None or self._conn.closed or self._conn.broken:
            with contextlib.suppress(Exception):
                if self._conn is not None:
                    self._conn.close()
            self._conn = None
            try:
                conn = psycopg.connect(self.url, autocommit=self._autocommit, connect_timeout=10)
            except psycopg.OperationalError as exc:
                raise StoreUnavailable(f"PostgreSQL unreachable: {exc}".strip()) from exc
            for stmt in self._setup:
                conn.execute(stmt)
            if not self._autocommit:
                conn.commit()
            self._conn = conn
        return self._conn

    def run(self, fn: Callable[[Any], _T], *, idempotent: bool = False) -> _T:
        """`fn(connection)`; a connection lost on the way raises `StoreUnavailable`.

        An `idempotent` call (a read, an upsert, a delete) is tried once more on a new connection
        first: a connection that broke while idle (the server restarted since) fails its next
        call, and that call may safely run again. Other writes are not repeated: their commit may
        have happened, so their caller decides (a retried turn replaces itself, a retried finish
        gets its stored answer).
        """
        psycopg = psycopg_module()
        if not idempotent:
            self._drop_if_closed_by_server()
        for attempt in (1, 2):
            conn = self.conn()
            try:
                return fn(conn)
            except psycopg.OperationalError as exc:
                if not (conn.broken or conn.closed):
                    raise
                if attempt == 2 or not idempotent:
                    raise StoreUnavailable(f"PostgreSQL connection lost: {exc}".strip()) from exc
        raise AssertionError("unreachable")

    def _drop_if_closed_by_server(self) -> None:
        """Forget an idle connection whose server hung up (a restart ended its backend).

        Such a connection would fail the next statement only after sending it, and a write that
        cannot be repeated would then fail although the database is back. An idle connection
        (nothing in flight, no LISTEN on a `run` link) has nothing to read unless the server closed
        it or is about to: one non-blocking `select` tells, and the write goes to a new connection.
        """
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            return
        try:
            readable, _, _ = select.select([conn.fileno()], [], [], 0)
        except (OSError, ValueError):
            readable = [True]
        if readable:
            self.close()

    def close(self) -> None:
        """Close the connection if one is open."""
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None


def insert_finishes(conn: Any, batch: list[Finish]) -> list[list[int] | BaseException]:
    """Insert finishes inside the caller's open transaction; the caller commits.

    Takes the cursor counter's row lock first (held until the commit), so cursors follow commit
    order across every writer. Each finish sits in a savepoint: one that fails is rolled back
    alone (its cursors stay unused: cursors grow, with gaps). Returns, per finish, its cursors
    or its exception.
    """
    total = sum(len(rows) for rows, _ in batch)
    (last,) = conn.execute("UPDATE commit_counter SET last = last + %s RETURNING last", (total,)).fetchone()
    nxt = last - total + 1
    out: list[list[int] | BaseException] = []
    tenants: set[str] = set()
    for rows, outcome in batch:
        cursors = list(range(nxt, nxt + len(rows)))
        nxt += len(rows)
        try:
            with conn.transaction():  # a savepoint inside the caller's transaction
                # Every writer waits on the counter's row lock above until this commits, and each
                # statement reads what was committed before it (READ COMMITTED): no other gateway can
                # store the rollout between this check and the commit.
                refuse_stored_rollout(conn, outcome, _ROLLOUT_DOC)
                with conn.cursor() as cur:
                    cur.executemany(_INSERT, [(c, *row) for c, row in zip(cursors, rows, strict=True)])
                if outcome is not None:
                    conn.execute(
                        "INSERT INTO outcomes (session_id, tenant, doc, rollout_id) VALUES (%s, %s, %s, %s)",
                        (outcome.session_id, outcome.tenant, outcome.doc(cursors), outcome.rollout_id),
                    )
        except Exception as exc:
            if conn.broken:
                raise
            out.append(exc)
            continue
        out.append(cursors)
        tenants.update(row[0] for row in rows)
    for tenant in tenants:
        conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, tenant))  # delivered at commit
    return out


class PgTrajectoryStore(GroupCommitStore):
    """Finished samples in PostgreSQL, readable by cursor per tenant (see the module docstring).

    The same methods as `store.TrajectoryStore`; `location` is the database URL.
    """

    def __init__(self, url: str, *, readonly: bool) -> None:
        self.location = url
        self._readonly = readonly
        # A finish answers once its commit is flushed to the server's WAL, whatever the server's default.
        self._writer = Link(url, autocommit=False, setup=(SEARCH_PATH, "SET synchronous_commit = on"))
        self._reader = Link(url, autocommit=True, setup=(SEARCH_PATH,))
        self._write_pool = ThreadPoolExecutor(1, thread_name_prefix="rlgw-pgstore-w")
        self._read_pool = ThreadPoolExecutor(1, thread_name_prefix="rlgw-pgstore-r")
        self._pending: queue.SimpleQueue[PendingFinish] = queue.SimpleQueue()
        self._events: dict[str, asyncio.Event] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._listening = threading.Event()
        self._listener: threading.Thread | None = None

    @classmethod
    def open(cls, url: str) -> PgTrajectoryStore:
        """Connect to `url`, creating the tables if needed; raises `StoreError` on a foreign schema."""
        store = cls(url, readonly=False)
        store._writer.run(store._create_schema)
        return store

    @classmethod
    def open_readonly(cls, url: str) -> PgTrajectoryStore:
        """Connect for reading only (the CLI); raises `StoreError` if `url` holds no store."""
        store = cls(url, readonly=True)
        store._reader.run(store._check_schema)
        return store

    def _create_schema(self, conn: Any) -> None:
        # One creator at a time: several gateways may start together on an empty database.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('rlgw_store_schema'))")
        conn.execute(SCHEMA)
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('schema_version', %s) ON CONFLICT DO NOTHING",
            (str(SCHEMA_VERSION),),
        )
        conn.commit()
        self._check_schema(conn)

    def _check_schema(self, conn: Any) -> None:
        psycopg = psycopg_module()
        try:
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except psycopg.errors.UndefinedTable as exc:
            raise StoreError(f"{self._where()} holds no trajectory store") from exc
        if row is None or int(row[0]) != SCHEMA_VERSION:
            found = None if row is None else row[0]
            raise StoreError(
                f"{self._where()} has schema version {found}; this rlgw reads version {SCHEMA_VERSION}"
            )

    def _where(self) -> str:
        from psycopg.conninfo import conninfo_to_dict

        info = conninfo_to_dict(self.location)
        return f"PostgreSQL database {info.get('dbname', '?')!r} at {info.get('host', 'localhost')}"

    # -- writing ---------------------------------------------------------------------------

    def _commit_batch(self, batch: list[Finish]) -> list[list[int] | BaseException]:
        """Writer thread: commit the finishes in one transaction (`insert_finishes`)."""

        def commit(conn: Any) -> list[list[int] | BaseException]:
            try:
                outcomes = insert_finishes(conn, batch)
                conn.commit()
            except BaseException:
                if not conn.broken:
                    conn.rollback()
                raise
            return outcomes

        return self._writer.run(commit)

    # -- reading ---------------------------------------------------------------------------

    def _query(self, sql: str, args: tuple[Any, ...] | list[Any]) -> list[tuple[Any, ...]]:
        # The shared reads are written with SQLite's `?`; psycopg's placeholder is `%s`. Binary
        # results: a frame arrives as its bytes, not as hex text twice its size to decode.
        return self._reader.run(
            lambda conn: conn.execute(sql.replace("?", "%s"), args, binary=True).fetchall(), idempotent=True
        )

    def stored_sessions_sync(self, session_ids: list[str]) -> set[str]:
        """Which of `session_ids` are closed in the store: samples or an outcome committed."""
        rows = self._query(
            "SELECT DISTINCT session_id FROM samples WHERE session_id = ANY(%s) "
            "UNION SELECT session_id FROM outcomes WHERE session_id = ANY(%s)",
            (session_ids, session_ids),
        )
        return {r[0] for r in rows}

    # -- the long poll ---------------------------------------------------------------------

    def _listen(self, loop: asyncio.AbstractEventLoop) -> None:
        """Listener thread: wake a tenant's waiters on each notification; on a lost connection wake
        every waiter (they re-read) and listen again once the database is back."""
        link = Link(self.location, autocommit=True, setup=(f"LISTEN {CHANNEL}",))  # no tables: no search_path
        while not self._stop.is_set():
            try:
                conn = link.conn()
                self._listening.set()
                # The timeout only bounds how long `close` waits for this thread.
                for note in conn.notifies(timeout=0.5):
                    loop.call_soon_threadsafe(self._wake, note.payload)
            except Exception as exc:
                self._listening.set()  # waiters must not wait for a listener that cannot start
                loop.call_soon_threadsafe(self._wake, None)
                log.warning("store listener: %s; listening again in 1 s", exc)
                link.close()
                self._stop.wait(1.0)
        link.close()

    def _wake(self, tenant: str | None) -> None:
        if tenant is None:
            events, self._events = list(self._events.values()), {}
        else:
            events = [e] if (e := self._events.pop(tenant, None)) is not None else []
        for event in events:
            event.set()

    async def _prepare_wait(self) -> None:
        """Start the listener thread at the first wait (it needs the running loop); wait until it listens."""
        if self._listener is None:
            self._loop = asyncio.get_running_loop()
            self._listener = threading.Thread(
                target=self._listen, args=(self._loop,), name="rlgw-pgstore-listen", daemon=True
            )
            self._listener.start()
        if not self._listening.is_set():
            await asyncio.to_thread(self._listening.wait)

    async def ready(self) -> None:
        """Raise unless the database answers and this store may write (for /readyz)."""
        await self._read(lambda: self._query("SELECT 1 FROM commit_counter", ()))

    async def close(self) -> None:
        """Close the connections after pending work finishes."""
        await asyncio.get_running_loop().run_in_executor(None, self.close_sync)

    def close_sync(self) -> None:
        """Synchronous `close`, for code without an event loop."""
        self._stop.set()
        if self._listener is not None:
            self._listener.join()
        self._write_pool.shutdown(wait=True)
        self._read_pool.shutdown(wait=True)
        self._writer.close()
        self._reader.close()
