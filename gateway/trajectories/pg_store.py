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
commit (`tests/gateway/test_pg_cursor.py` shows a BIGSERIAL cursor skipping a row and this
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
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import orjson

from rlgw.gateway.errors import StoreUnavailable
from rlgw.gateway.sample import Sample
from rlgw.gateway.trajectories.store import (
    SCHEMA_VERSION,
    OutcomeFn,
    SampleSummary,
    StoredOutcome,
    StoredSample,
    StoreError,
    row_values,
    stored_from_row,
)

log = logging.getLogger(__name__)

CHANNEL = "rlgw_samples"
_T = TypeVar("_T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS rlgw_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rlgw_cursor (
    one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one), last BIGINT NOT NULL
);
INSERT INTO rlgw_cursor (one, last) VALUES (TRUE, 0) ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS rlgw_samples (
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
CREATE INDEX IF NOT EXISTS rlgw_samples_by_tenant ON rlgw_samples (tenant, cursor);
CREATE INDEX IF NOT EXISTS rlgw_samples_by_session ON rlgw_samples (session_id);
CREATE INDEX IF NOT EXISTS rlgw_samples_by_task ON rlgw_samples (tenant, task_id, cursor);
CREATE INDEX IF NOT EXISTS rlgw_samples_by_status ON rlgw_samples (tenant, status, cursor);
CREATE INDEX IF NOT EXISTS rlgw_samples_by_reward ON rlgw_samples (tenant, reward);
CREATE TABLE IF NOT EXISTS rlgw_outcomes (
    session_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, doc BYTEA NOT NULL
);
"""

_INSERT = (
    "INSERT INTO rlgw_samples (cursor, tenant, session_id, task_id, segment, created_at, rollout_id, "
    "group_index, status, reward, response_length, trainable_tokens, arrays, weight_versions, metadata) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
_COLUMNS = (
    "cursor, tenant, session_id, task_id, segment, created_at, rollout_id, group_index, status, reward, "
    "response_length, arrays, weight_versions, metadata"
)
_SUMMARY_COLUMNS = (
    "cursor, tenant, session_id, task_id, segment, created_at, rollout_id, group_index, status, reward, "
    "response_length, trainable_tokens, weight_versions, metadata"
)
# One finish: its rows, its outcome, and where its cursors (or its error) go.
_Pending = tuple[list[tuple[Any, ...]], StoredOutcome | None, Future[list[int]]]


def is_url(location: str) -> bool:
    """Whether a `--store`/`--journal` value names a PostgreSQL database rather than a path."""
    return location.startswith(("postgresql://", "postgres://"))


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
        import psycopg

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

    def run(self, fn: Callable[[Any], _T]) -> _T:
        """`fn(connection)`; a connection lost on the way raises `StoreUnavailable`."""
        import psycopg

        conn = self.conn()
        try:
            return fn(conn)
        except psycopg.OperationalError as exc:
            if conn.broken or conn.closed:
                raise StoreUnavailable(f"PostgreSQL connection lost: {exc}".strip()) from exc
            raise

    def close(self) -> None:
        """Close the connection if one is open."""
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None


def insert_finishes(conn: Any, batch: list[tuple[list[tuple[Any, ...]], StoredOutcome | None]]) -> list[Any]:
    """Insert finishes inside the caller's open transaction; the caller commits.

    Takes the cursor counter's row lock first (held until the commit), so cursors follow commit
    order across every writer. Each finish sits in a savepoint: one that fails is rolled back
    alone (its cursors stay unused: cursors grow, with gaps). Returns, per finish, its cursors
    or its exception.
    """
    total = sum(len(rows) for rows, _ in batch)
    (last,) = conn.execute("UPDATE rlgw_cursor SET last = last + %s RETURNING last", (total,)).fetchone()
    nxt = last - total + 1
    out: list[Any] = []
    tenants: set[str] = set()
    for rows, outcome in batch:
        cursors = list(range(nxt, nxt + len(rows)))
        nxt += len(rows)
        try:
            with conn.transaction():  # a savepoint inside the caller's transaction
                with conn.cursor() as cur:
                    cur.executemany(_INSERT, [(c, *row) for c, row in zip(cursors, rows, strict=True)])
                if outcome is not None:
                    conn.execute(
                        "INSERT INTO rlgw_outcomes (session_id, tenant, doc) VALUES (%s, %s, %s)",
                        (outcome.session_id, outcome.tenant, outcome.doc(cursors)),
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


class PgTrajectoryStore:
    """Finished samples in PostgreSQL, readable by cursor per tenant (see the module docstring).

    The same methods as `store.TrajectoryStore`; `location` is the database URL.
    """

    def __init__(self, url: str, *, readonly: bool) -> None:
        self.location = url
        self._readonly = readonly
        self._writer = Link(url, autocommit=False)
        self._reader = Link(url, autocommit=True)
        self._write_pool = ThreadPoolExecutor(1, thread_name_prefix="rlgw-pgstore-w")
        self._read_pool = ThreadPoolExecutor(1, thread_name_prefix="rlgw-pgstore-r")
        self._pending: queue.SimpleQueue[_Pending] = queue.SimpleQueue()
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
            "INSERT INTO rlgw_meta (key, value) VALUES ('schema_version', %s) ON CONFLICT DO NOTHING",
            (str(SCHEMA_VERSION),),
        )
        conn.commit()
        self._check_schema(conn)

    def _check_schema(self, conn: Any) -> None:
        import psycopg

        try:
            row = conn.execute("SELECT value FROM rlgw_meta WHERE key = 'schema_version'").fetchone()
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

    def _commit_pending(self) -> None:
        """Writer thread: commit every queued finish in one transaction (group commit)."""
        batch: list[_Pending] = []
        while not self._pending.empty():
            batch.append(self._pending.get_nowait())
        if not batch:
            return  # an earlier call already committed these along with its own

        def commit(conn: Any) -> list[Any]:
            try:
                outcomes = insert_finishes(conn, [(rows, outcome) for rows, outcome, _ in batch])
                conn.commit()
            except BaseException:
                if not conn.broken:
                    conn.rollback()
                raise
            return outcomes

        try:
            results = self._writer.run(commit)
        except BaseException as exc:
            results = [exc] * len(batch)
        for (_, _, future), result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

    async def add_samples(
        self,
        tenant: str,
        session_id: str,
        task_id: str,
        samples: list[Sample],
        *,
        segments: list[int] | None = None,
        outcome: OutcomeFn | None = None,
    ) -> list[int]:
        """Store the segments of one finished session all or nothing (as `TrajectoryStore.add_samples`)."""
        if self._readonly:
            raise StoreError("this store was opened read-only")
        if not samples and outcome is None:
            return []
        if segments is None:
            segments = list(range(len(samples)))
        elif len(segments) != len(samples):
            raise ValueError(f"{len(segments)} segment indices for {len(samples)} samples")
        now = time.time()
        rows = await asyncio.to_thread(
            lambda: [
                row_values(tenant, session_id, task_id, seg, now, s)
                for seg, s in zip(segments, samples, strict=True)
            ]
        )
        future: Future[list[int]] = Future()
        stored = None if outcome is None else StoredOutcome(tenant, session_id, outcome)
        self._pending.put((rows, stored, future))
        self._write_pool.submit(self._commit_pending)
        cursors = await asyncio.wrap_future(future)
        if (event := self._events.pop(tenant, None)) is not None:
            event.set()
        return cursors

    # -- reading ---------------------------------------------------------------------------

    def _query(self, sql: str, args: tuple[Any, ...] | list[Any]) -> list[tuple[Any, ...]]:
        return self._reader.run(lambda conn: conn.execute(sql, args).fetchall())

    def list_sync(self, tenant: str | None, *, after: int = 0, limit: int = 100) -> list[StoredSample]:
        """Samples with cursor > `after`, oldest first, at most `limit`; `tenant=None` means all."""
        if tenant is None:
            q = f"SELECT {_COLUMNS} FROM rlgw_samples WHERE cursor > %s ORDER BY cursor LIMIT %s"
            rows = self._query(q, (after, limit))
        else:
            q = (
                f"SELECT {_COLUMNS} FROM rlgw_samples WHERE tenant = %s AND cursor > %s "
                "ORDER BY cursor LIMIT %s"
            )
            rows = self._query(q, (tenant, after, limit))
        return [stored_from_row(r) for r in rows]

    def get_sync(self, tenant: str | None, cursor: int) -> StoredSample | None:
        """The sample at `cursor` if it exists and belongs to `tenant` (`None`: any tenant)."""
        rows = self._query(f"SELECT {_COLUMNS} FROM rlgw_samples WHERE cursor = %s", (cursor,))
        if not rows or (tenant is not None and rows[0][1] != tenant):
            return None
        return stored_from_row(rows[0])

    def summaries_sync(
        self,
        tenant: str | None,
        *,
        after: int = 0,
        before: int | None = None,
        limit: int = 100,
        newest_first: bool = False,
    ) -> list[SampleSummary]:
        """Samples with `after` < cursor < `before`, without their token arrays."""
        where, args = ["cursor > %s"], [after]
        if before is not None:
            where.append("cursor < %s")
            args.append(before)
        if tenant is not None:
            where.append("tenant = %s")
            args.append(tenant)
        order = "DESC" if newest_first else "ASC"
        q = f"SELECT {_SUMMARY_COLUMNS} FROM rlgw_samples WHERE {' AND '.join(where)} ORDER BY cursor {order}"
        return [SampleSummary.from_row(r) for r in self._query(q + " LIMIT %s", (*args, limit))]

    def count_sync(self, tenant: str | None, *, after: int = 0) -> int:
        """How many samples have cursor > `after` (for `tenant`, or all)."""
        if tenant is None:
            rows = self._query("SELECT COUNT(*) FROM rlgw_samples WHERE cursor > %s", (after,))
        else:
            rows = self._query(
                "SELECT COUNT(*) FROM rlgw_samples WHERE tenant = %s AND cursor > %s", (tenant, after)
            )
        return int(rows[0][0])

    def iter_sync(self, tenant: str | None, *, after: int = 0, batch: int = 64) -> Iterator[StoredSample]:
        """Every sample after `after`, oldest first, read `batch` rows at a time."""
        while chunk := self.list_sync(tenant, after=after, limit=batch):
            yield from chunk
            after = chunk[-1].cursor

    def stored_sessions_sync(self, session_ids: list[str]) -> set[str]:
        """Which of `session_ids` are closed in the store: samples or an outcome committed."""
        rows = self._query(
            "SELECT DISTINCT session_id FROM rlgw_samples WHERE session_id = ANY(%s) "
            "UNION SELECT session_id FROM rlgw_outcomes WHERE session_id = ANY(%s)",
            (session_ids, session_ids),
        )
        return {r[0] for r in rows}

    def outcome_sync(self, tenant: str, session_id: str) -> dict[str, Any] | None:
        """What the tenant's finish or delete of `session_id` answered, if one was committed."""
        rows = self._query(
            "SELECT doc FROM rlgw_outcomes WHERE session_id = %s AND tenant = %s", (session_id, tenant)
        )
        return orjson.loads(rows[0][0]) if rows else None

    def _latest_cursor(self, tenant: str) -> int:
        rows = self._query("SELECT MAX(cursor) FROM rlgw_samples WHERE tenant = %s", (tenant,))
        return int(rows[0][0] or 0)

    async def _read(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._read_pool, lambda: fn(*args, **kwargs))

    async def list(self, tenant: str, *, after: int = 0, limit: int = 100) -> list[StoredSample]:
        """The tenant's samples with cursor > `after`, oldest first, at most `limit`."""
        return await self._read(self.list_sync, tenant, after=after, limit=limit)

    async def get(self, tenant: str, cursor: int) -> StoredSample | None:
        """The tenant's sample at `cursor`, or None (also when it belongs to another tenant)."""
        return await self._read(self.get_sync, tenant, cursor)

    async def summaries(self, tenant: str | None, **kwargs: Any) -> list[SampleSummary]:
        """`summaries_sync` on the reader thread."""
        return await self._read(self.summaries_sync, tenant, **kwargs)

    async def stored_sessions(self, session_ids: list[str]) -> set[str]:
        """`stored_sessions_sync` on the reader thread."""
        return await self._read(self.stored_sessions_sync, session_ids)

    async def outcome(self, tenant: str, session_id: str) -> dict[str, Any] | None:
        """`outcome_sync` on the reader thread."""
        return await self._read(self.outcome_sync, tenant, session_id)

    # -- the long poll ---------------------------------------------------------------------

    def _listen(self, loop: asyncio.AbstractEventLoop) -> None:
        """Listener thread: wake a tenant's waiters on each notification; on a lost connection wake
        every waiter (they re-read) and listen again once the database is back."""
        link = Link(self.location, autocommit=True, setup=(f"LISTEN {CHANNEL}",))
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

    async def _ensure_listener(self) -> None:
        if self._listener is None:
            self._loop = asyncio.get_running_loop()
            self._listener = threading.Thread(
                target=self._listen, args=(self._loop,), name="rlgw-pgstore-listen", daemon=True
            )
            self._listener.start()
        if not self._listening.is_set():
            await asyncio.to_thread(self._listening.wait)

    async def wait(self, tenant: str, *, after: int, timeout: float) -> None:  # noqa: ASYNC109
        """Return once the tenant has a sample with cursor > `after`, or after `timeout` seconds."""
        await self._ensure_listener()
        deadline = time.monotonic() + timeout
        while True:
            # The event is taken before reading: a notification between the read and the sleep sets it.
            event = self._events.setdefault(tenant, asyncio.Event())
            if await self._read(self._latest_cursor, tenant) > after:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)

    async def ready(self) -> None:
        """Raise unless the database answers and this store may write (for /readyz)."""
        await self._read(lambda: self._query("SELECT 1 FROM rlgw_cursor", ()))

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
