"""The trajectory store: finished samples in SQLite (WAL), durable before `finish` answers.

This module owns the on-disk format of stored samples and the cursor that orders them: one
row per sample, cursor = SQLite's AUTOINCREMENT id (monotonic, never reused), scoped by
tenant on every read. Token arrays are stored as one zstd frame of little-endian raw
arrays behind a small JSON manifest (`encode_arrays`); `weight_versions` and `metadata` are
JSON. A few summary columns (status, reward, lengths) are duplicated out of the blob so
the CLI and ad-hoc SQL can list samples without decoding them.

It does not own HTTP (`api.py`), validation (`sample.validate_sample`, done by
the caller before `add_samples`), or sessions. Async methods belong to the event loop
that first uses them; SQLite work runs on two dedicated threads (one writer connection,
one reader connection) so the loop never blocks on disk and readers never wait behind
an fsync (WAL lets them read while the writer commits).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import queue
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import zstandard

from rlgw.gateway.sample import Sample, SampleStatus, VersionSpan

SCHEMA_VERSION = 1
DB_NAME = "trajectories.sqlite3"
# zstd level 3, one frame for all arrays: on 32k-token Qwen3 samples (measured when choosing)
# it was within 4% of level 6's size at under half the time, one frame per array saved
# nothing, and byte-shuffling the arrays made them 5-10% larger. bench/store.py reports it.
ZSTD_LEVEL = 3
# How often `wait` re-reads the database when no in-process commit woke it; this only
# matters when another process writes the same file.
CROSS_PROCESS_POLL_S = 1.0

_ARRAY_FIELDS: dict[str, np.dtype | None] = {
    "tokens": np.dtype("<i4"),
    "loss_mask": np.dtype("u1"),
    "rollout_log_probs": np.dtype("<f4"),
    "teacher_log_probs": np.dtype("<f4"),
    "teacher_topk_indices": np.dtype("<i4"),
    "teacher_topk_logprobs": np.dtype("<f4"),
    "rollout_routed_experts": None,  # its own: uint8, or int16 past 256 experts (`compact_routing`)
}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS samples (
    cursor INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL,
    session_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    segment INTEGER NOT NULL,
    created_at REAL NOT NULL,
    rollout_id TEXT NOT NULL,
    group_index INTEGER NOT NULL,
    status TEXT NOT NULL,
    reward REAL,
    response_length INTEGER NOT NULL,
    trainable_tokens INTEGER NOT NULL,
    arrays BLOB NOT NULL,
    weight_versions BLOB NOT NULL,
    metadata BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS samples_by_tenant ON samples (tenant, cursor);
CREATE INDEX IF NOT EXISTS samples_by_session ON samples (session_id);
CREATE TABLE IF NOT EXISTS outcomes (session_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, doc BLOB NOT NULL);
"""
# A finish's outcome carries its rollout id, so that a rerun of a rollout whose finish is stored (its
# worker died before the answer came back) is refused; a delete's has none. Added after the table.
_OUTCOME_ROLLOUTS = "CREATE INDEX IF NOT EXISTS outcomes_by_rollout ON outcomes (tenant, rollout_id)"
ROLLOUT_DOC = "SELECT doc FROM outcomes WHERE tenant = ? AND rollout_id = ? LIMIT 1"

_INSERT = (
    "INSERT INTO samples (tenant, session_id, task_id, segment, created_at, rollout_id, group_index, status, "
    "reward, response_length, trainable_tokens, arrays, weight_versions, metadata) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# What a finish or delete answered, built from the finish's cursors inside its transaction: a retry
# of a finish whose answer was lost (its gateway killed after the commit) gets it back from here.
OutcomeFn = Callable[[list[int]], dict[str, Any]]
# One finish for the writer thread: its rows and its outcome; waiting, with where to put its cursors.
Finish = tuple[list[tuple[Any, ...]], "StoredOutcome | None"]
PendingFinish = tuple[list[tuple[Any, ...]], "StoredOutcome | None", Future[list[int]]]
_COLUMNS = (
    "cursor, tenant, session_id, task_id, segment, created_at, rollout_id, group_index, status, reward, \
response_length, arrays, weight_versions, metadata"
)


# Arrays go straight from numpy to JSON (no Python lists); float32 prints in shortest exact form.
_JSON_OPTS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE


@dataclass(frozen=True, slots=True)
class StoredOutcome:
    """The answer to store beside a finish's samples: whose session, and how to build it from the cursors."""

    tenant: str
    session_id: str
    build: OutcomeFn
    rollout_id: str | None = None

    def doc(self, cursors: list[int]) -> bytes:
        """The answer as stored (JSON)."""
        return orjson.dumps(self.build(cursors))


class StoreError(RuntimeError):
    """The database file is missing, of another schema version, or not a trajectory store."""


class RolloutTaken(Exception):
    """A finish of a rollout whose finish another session already stored; nothing of it was stored.

    Two live attempts of one rollout (a runner thought dead and its retry) can both reach their
    finish: the first to commit is the rollout's, the second is refused with the first's summary,
    so the trainer never sees the rollout twice.
    """

    def __init__(self, rollout_id: str, summary: dict[str, Any]) -> None:
        super().__init__(f"rollout {rollout_id!r} is already stored (session {summary.get('session_id')})")
        self.rollout_id = rollout_id
        self.summary = summary


def refuse_stored_rollout(conn: Any, outcome: Any, query: str = ROLLOUT_DOC) -> None:
    """Raise `RolloutTaken` if `outcome`'s rollout already has a stored finish (`conn`: a DB-API
    connection inside the writer's transaction; `query`: `ROLLOUT_DOC` in its driver's paramstyle)."""
    if outcome is None or outcome.rollout_id is None:
        return
    taken = conn.execute(query, (outcome.tenant, outcome.rollout_id)).fetchone()
    if taken is not None:
        raise RolloutTaken(outcome.rollout_id, orjson.loads(taken[0]))


@dataclass(frozen=True, slots=True)
class StoredSample:
    """A sample as the store holds it: its cursor, owner and where it came from."""

    cursor: int
    tenant: str
    session_id: str
    task_id: str
    segment: int
    created_at: float
    sample: Sample

    def to_dict(self, *, numpy: bool = False) -> dict[str, Any]:
        """The wire form: ids first, then the sample's slime-compatible fields (`Sample.to_dict`).

        The tenant is left out: a caller only ever sees its own samples.
        """
        return {
            "cursor": self.cursor,
            "session_id": self.session_id,
            "task_id": self.task_id,
            "segment": self.segment,
            "created_at": self.created_at,
            **self.sample.to_dict(numpy=numpy),
        }

    def to_json(self, *, with_tenant: bool = False) -> bytes:
        """`to_dict()` as one NDJSON line (newline included), optionally naming the tenant first."""
        doc = self.to_dict(numpy=True)
        if with_tenant:
            doc = {"tenant": self.tenant, **doc}
        return orjson.dumps(doc, option=_JSON_OPTS)


_SUMMARY_COLUMNS = (
    "cursor, tenant, session_id, task_id, segment, created_at, rollout_id, group_index, status, reward, "
    "response_length, trainable_tokens, weight_versions, metadata"
)


@dataclass(frozen=True, slots=True)
class SampleSummary:
    """A stored sample's row without its token arrays: what a listing shows."""

    cursor: int
    tenant: str
    session_id: str
    task_id: str
    segment: int
    created_at: float
    rollout_id: str
    group_index: int
    status: str
    reward: float | None
    response_length: int
    trainable_tokens: int
    weight_versions: list[VersionSpan]
    metadata: dict[str, Any]

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> SampleSummary:
        """Build from a `_SUMMARY_COLUMNS` row."""
        *head, versions, metadata = row
        spans = [VersionSpan(v, s, e) for v, s, e in orjson.loads(versions)]
        return cls(*head, weight_versions=spans, metadata=orjson.loads(metadata))


def default_data_dir() -> Path:
    """`$RLGW_DATA_DIR`, else `$XDG_DATA_HOME/rlgw`, else `~/.local/share/rlgw`."""
    if env := os.environ.get("RLGW_DATA_DIR"):
        return Path(env).expanduser()
    if xdg := os.environ.get("XDG_DATA_HOME"):
        return Path(xdg).expanduser() / "rlgw"
    return Path.home() / ".local" / "share" / "rlgw"


def encode_arrays(sample: Sample) -> bytes:
    """The sample's arrays as one zstd frame: u32 manifest length, JSON manifest, raw arrays.

    The manifest lists `[name, dtype, shape]` in order; arrays are little-endian and
    C-contiguous, so decoding is one decompress and zero-copy slicing.
    """
    manifest: list[list[Any]] = []
    parts: list[bytes] = []
    for name, dtype in _ARRAY_FIELDS.items():
        value = getattr(sample, name)
        if value is None:
            continue
        arr = np.ascontiguousarray(value, dtype=dtype)  # None: the array's own dtype
        manifest.append([name, arr.dtype.str, list(arr.shape)])
        parts.append(arr.tobytes())
    head = orjson.dumps(manifest)
    raw = b"".join([len(head).to_bytes(4, "little"), head, *parts])
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(raw)


def decode_arrays(blob: bytes) -> dict[str, np.ndarray]:
    """Inverse of `encode_arrays`; the arrays are writable and share one buffer."""
    raw = bytearray(zstandard.ZstdDecompressor().decompress(blob))
    head_len = int.from_bytes(raw[:4], "little")
    offset = 4 + head_len
    out: dict[str, np.ndarray] = {}
    for name, dtype_str, shape in orjson.loads(raw[4:offset]):
        dtype = np.dtype(dtype_str)
        count = int(np.prod(shape, dtype=np.int64))
        out[name] = np.frombuffer(raw, dtype=dtype, count=count, offset=offset).reshape(shape)
        offset += count * dtype.itemsize
    if offset != len(raw):
        raise StoreError(f"array blob has {len(raw) - offset} trailing bytes")
    return out


def row_values(
    tenant: str, session_id: str, task_id: str, segment: int, created_at: float, sample: Sample
) -> tuple[Any, ...]:
    return (
        tenant,
        session_id,
        task_id,
        segment,
        created_at,
        sample.rollout_id,
        sample.group_index,
        str(sample.status),
        sample.reward,
        sample.response_length,
        int(np.count_nonzero(sample.loss_mask)),
        encode_arrays(sample),
        orjson.dumps([[s.version, s.start, s.end] for s in sample.weight_versions]),
        orjson.dumps(sample.metadata),
    )


def stored_from_row(row: tuple[Any, ...]) -> StoredSample:
    (
        cursor,
        tenant,
        session_id,
        task_id,
        segment,
        created_at,
        rollout_id,
        group_index,
        status,
        reward,
        response_length,
        arrays,
        weight_versions,
        metadata,
    ) = row
    arr = decode_arrays(arrays)
    sample = Sample(
        tokens=arr["tokens"],
        response_length=response_length,
        loss_mask=arr["loss_mask"],
        rollout_log_probs=arr["rollout_log_probs"],
        reward=reward,
        status=SampleStatus(status),
        rollout_id=rollout_id,
        group_index=group_index,
        weight_versions=[VersionSpan(v, s, e) for v, s, e in orjson.loads(weight_versions)],
        metadata=orjson.loads(metadata),
        teacher_log_probs=arr.get("teacher_log_probs"),
        teacher_topk_indices=arr.get("teacher_topk_indices"),
        teacher_topk_logprobs=arr.get("teacher_topk_logprobs"),
        rollout_routed_experts=arr.get("rollout_routed_experts"),
    )
    return StoredSample(cursor, tenant, session_id, task_id, segment, created_at, sample)


def _connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    if readonly:
        if not path.exists():
            raise StoreError(f"no trajectory store at {path}")
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
    else:
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit is fsynced before add_samples returns, so `finish` never answers
        # for a sample that a power cut could take back (NORMAL in WAL mode could).
        conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=10000")
    return conn


def check_writable(path: Path, timeout: float = 2.0) -> None:
    """Raise unless the SQLite file at `path` can be written now; writes nothing.

    BEGIN IMMEDIATE takes SQLite's write lock: it fails if the file, its directory or its WAL
    cannot be written (or another writer holds the lock past the timeout).
    """
    conn = sqlite3.connect(path, timeout=timeout, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def _check_schema(conn: sqlite3.Connection, path: Path) -> None:
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path} is not a trajectory store: {exc}") from exc
    if row is None or int(row[0]) != SCHEMA_VERSION:
        found = None if row is None else row[0]
        raise StoreError(f"{path} has schema version {found}; this rlgw reads version {SCHEMA_VERSION}")


class GroupCommitStore(abc.ABC):
    """What both backends share: the group-committed write path and the async reads on the reader thread.

    A subclass provides the connections' threads (`_write_pool`, `_read_pool`), the queue its
    writer thread drains in `_commit_pending` (`_pending`), the per-tenant wake-up events, and the
    `*_sync` reads.
    """

    _readonly: bool
    _pending: queue.SimpleQueue[PendingFinish]
    _write_pool: ThreadPoolExecutor
    _read_pool: ThreadPoolExecutor
    _events: dict[str, asyncio.Event]

    @abc.abstractmethod
    def _commit_batch(self, batch: list[Finish]) -> list[list[int] | BaseException]:
        """Writer thread: commit these finishes in one transaction; per finish, its cursors or its error."""

    def _commit_pending(self) -> None:
        """Writer thread: commit every queued finish in one transaction (group commit)."""
        pending: list[PendingFinish] = []
        while not self._pending.empty():
            pending.append(self._pending.get_nowait())
        if not pending:
            return  # an earlier call already committed this finish along with its own
        try:
            results = self._commit_batch([(rows, outcome) for rows, outcome, _ in pending])
        except BaseException as exc:
            results = [exc] * len(pending)
        for (_, _, future), result in zip(pending, results, strict=True):
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

    @abc.abstractmethod
    def stored_sessions_sync(self, session_ids: list[str]) -> set[str]:
        """See `TrajectoryStore`."""

    async def add_samples(
        self,
        tenant: str,
        session_id: str,
        task_id: str,
        samples: list[Sample],
        *,
        segments: list[int] | None = None,
        outcome: OutcomeFn | None = None,
        rollout_id: str | None = None,
    ) -> list[int]:
        """Store the segments of one finished session all or nothing.

        `segments[i]` is the ledger segment index of `samples[i]` (default: 0, 1, 2, ...);
        pass it when some segments were rejected, so the stored index matches the ledger's.
        `outcome(cursors)`, if given, is the finish's answer, stored in the same transaction (also
        when there are no samples) and returned by `outcome` from then on; a session has one.
        `rollout_id`, given with a finish's outcome, makes it `finished_rollout`'s answer too.
        Returns the cursors, in order, once the transaction is durable on disk.
        """
        if self._readonly:
            raise StoreError("this store was opened read-only")
        if not samples and outcome is None:
            return []
        if segments is None:
            segments = list(range(len(samples)))
        elif len(segments) != len(samples):
            raise ValueError(f"{len(segments)} segment indices for {len(samples)} samples")
        now = time.time()
        # Compression runs on the shared default executor so that several finishes can encode
        # in parallel (zstd releases the GIL); only the INSERT+fsync is serialized.
        rows = await asyncio.to_thread(
            lambda: [
                row_values(tenant, session_id, task_id, seg, now, s)
                for seg, s in zip(segments, samples, strict=True)
            ]
        )
        future: Future[list[int]] = Future()
        stored = None if outcome is None else StoredOutcome(tenant, session_id, outcome, rollout_id)
        self._pending.put((rows, stored, future))
        self._write_pool.submit(self._commit_pending)
        cursors = await asyncio.wrap_future(future)
        if (event := self._events.pop(tenant, None)) is not None:
            event.set()
        return cursors

    # -- reading ---------------------------------------------------------------------------

    def iter_sync(self, tenant: str | None, *, after: int = 0, batch: int = 64) -> Iterator[StoredSample]:
        """Every sample after `after`, oldest first, read `batch` rows at a time."""
        while chunk := self.list_sync(tenant, after=after, limit=batch):
            yield from chunk
            after = chunk[-1].cursor

    async def _read(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._read_pool, lambda: fn(*args, **kwargs))

    async def list(self, tenant: str, *, after: int = 0, limit: int = 100) -> list[StoredSample]:
        """The tenant's samples with cursor > `after`, oldest first, at most `limit`."""
        return await self._read(self.list_sync, tenant, after=after, limit=limit)

    async def outcome(self, tenant: str, session_id: str) -> dict[str, Any] | None:
        """`outcome_sync` on the reader thread."""
        return await self._read(self.outcome_sync, tenant, session_id)

    async def stored_sessions(self, session_ids: list[str]) -> set[str]:
        """`stored_sessions_sync` on the reader thread."""
        return await self._read(self.stored_sessions_sync, session_ids)

    async def get(self, tenant: str, cursor: int) -> StoredSample | None:
        """The tenant's sample at `cursor`, or None (also when it belongs to another tenant)."""
        return await self._read(self.get_sync, tenant, cursor)

    async def summaries(self, tenant: str | None, **kwargs: Any) -> list[SampleSummary]:
        """`summaries_sync` on the reader thread."""
        return await self._read(self.summaries_sync, tenant, **kwargs)

    @abc.abstractmethod
    def _query(self, sql: str, args: tuple[Any, ...] | list[Any]) -> list[tuple[Any, ...]]:
        """Run a read (SQL with `?` placeholders) on the reader connection; all its rows."""

    def list_sync(self, tenant: str | None, *, after: int = 0, limit: int = 100) -> list[StoredSample]:
        """Samples with cursor > `after`, oldest first, at most `limit`; `tenant=None` means all."""
        if tenant is None:
            q, args = (
                f"SELECT {_COLUMNS} FROM samples WHERE cursor > ? ORDER BY cursor LIMIT ?",
                (after, limit),
            )
        else:
            q = f"SELECT {_COLUMNS} FROM samples WHERE tenant = ? AND cursor > ? ORDER BY cursor LIMIT ?"
            args = (tenant, after, limit)
        return [stored_from_row(r) for r in self._query(q, args)]

    def get_sync(self, tenant: str | None, cursor: int) -> StoredSample | None:
        """The sample at `cursor` if it exists and belongs to `tenant` (`None`: any tenant)."""
        rows = self._query(f"SELECT {_COLUMNS} FROM samples WHERE cursor = ?", (cursor,))
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
        """Samples with `after` < cursor < `before`, without their token arrays (nothing to decompress).

        For listings (the viewer): `newest_first` walks the (tenant, cursor) index backwards.
        """
        where, args = ["cursor > ?"], [after]
        if before is not None:
            where.append("cursor < ?")
            args.append(before)
        if tenant is not None:
            where.append("tenant = ?")
            args.append(tenant)
        order = "DESC" if newest_first else "ASC"
        query = f"SELECT {_SUMMARY_COLUMNS} FROM samples WHERE {' AND '.join(where)} ORDER BY cursor {order}"
        return [SampleSummary.from_row(r) for r in self._query(query + " LIMIT ?", (*args, limit))]

    def count_sync(self, tenant: str | None, *, after: int = 0) -> int:
        """How many samples have cursor > `after` (for `tenant`, or all)."""
        if tenant is None:
            q, args = "SELECT COUNT(*) FROM samples WHERE cursor > ?", (after,)
        else:
            q, args = "SELECT COUNT(*) FROM samples WHERE tenant = ? AND cursor > ?", (tenant, after)
        return int(self._query(q, args)[0][0])

    def _latest_cursor(self, tenant: str) -> int:
        rows = self._query("SELECT MAX(cursor) FROM samples WHERE tenant = ?", (tenant,))
        return int(rows[0][0] or 0)

    def outcome_sync(self, tenant: str, session_id: str) -> dict[str, Any] | None:
        """What the tenant's finish or delete of `session_id` answered, if one was committed."""
        rows = self._query(
            "SELECT doc FROM outcomes WHERE session_id = ? AND tenant = ?", (session_id, tenant)
        )
        return orjson.loads(rows[0][0]) if rows else None

    async def finished_rollout(self, tenant: str, rollout_id: str) -> dict[str, Any] | None:
        """`finished_rollout_sync` on the reader thread."""
        return await self._read(self.finished_rollout_sync, tenant, rollout_id)

    def finished_rollout_sync(self, tenant: str, rollout_id: str) -> dict[str, Any] | None:
        """The finish summary stored for the tenant's rollout `rollout_id`, if its finish was committed."""
        rows = self._query(ROLLOUT_DOC, (tenant, rollout_id))
        return orjson.loads(rows[0][0]) if rows else None

    def _repoll_s(self) -> float | None:
        """How long a waiter sleeps before reading again without a wake-up (None: until woken or done)."""
        return None

    async def _prepare_wait(self) -> None:
        """Whatever must run before the first wait (nothing here)."""
        return None

    async def wait(self, tenant: str, *, after: int, timeout: float) -> None:  # noqa: ASYNC109
        """Return once the tenant has a sample with cursor > `after`, or after `timeout` seconds.

        `timeout` is the long-poll length, so running out of it is a normal return, not an error.
        """
        await self._prepare_wait()
        deadline = time.monotonic() + timeout
        while True:
            # Take the event before reading, so a commit between the read and the sleep is
            # not missed: it sets this very event.
            event = self._events.setdefault(tenant, asyncio.Event())
            if await self._read(self._latest_cursor, tenant) > after:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            repoll = self._repoll_s()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), remaining if repoll is None else min(remaining, repoll))


class TrajectoryStore(GroupCommitStore):
    """Finished samples in one SQLite file, readable by cursor per tenant.

    - `add_samples` writes all segments of one finish atomically, fsynced before it returns,
      and wakes `wait`ers of that tenant at once. Finishes that arrive while a commit is in
      flight are committed together in the next one (group commit, one fsync for all).
    - `wait` long-polls without a busy loop: it sleeps on an in-process event, re-reading
      the database every `CROSS_PROCESS_POLL_S` only in case another process writes it.
    - `list_sync` / `get_sync` / `iter_sync` read without an event loop (the CLI opens the
      file read-only with `open_readonly`).
    """

    def __init__(self, path: Path, conn: sqlite3.Connection, reader: sqlite3.Connection, readonly: bool):
        self.path = path
        self._readonly = readonly
        self._writer = conn
        self._reader = reader
        # One thread per connection: each connection is only ever used from its own thread.
        self._write_pool = ThreadPoolExecutor(1, thread_name_prefix="rlgw-store-w")
        self._read_pool = ThreadPoolExecutor(1, thread_name_prefix="rlgw-store-r")
        self._events: dict[str, asyncio.Event] = {}
        self._pending: queue.SimpleQueue[PendingFinish] = queue.SimpleQueue()

    @classmethod
    def open(cls, data_dir: Path) -> TrajectoryStore:
        """Open (creating if needed) `data_dir/trajectories.sqlite3` for reading and writing."""
        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        path = data_dir / DB_NAME
        try:
            conn = _connect(path, readonly=False)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{path} is not a trajectory store: {exc}") from exc
        try:
            conn.execute("BEGIN IMMEDIATE")
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            if "rollout_id" not in {r[1] for r in conn.execute("PRAGMA table_info(outcomes)")}:
                conn.execute("ALTER TABLE outcomes ADD COLUMN rollout_id TEXT")  # a store from before it
            conn.execute(_OUTCOME_ROLLOUTS)
            conn.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
            conn.execute("COMMIT")
            _check_schema(conn, path)
        except BaseException:
            conn.close()
            raise
        return cls(path, conn, _connect(path, readonly=False), readonly=False)

    @classmethod
    def open_readonly(cls, data_dir: Path) -> TrajectoryStore:
        """Open an existing store read-only (for the CLI); raises `StoreError` if absent or foreign."""
        path = Path(data_dir) / DB_NAME
        conn = _connect(path, readonly=True)
        _check_schema(conn, path)
        return cls(path, conn, conn, readonly=True)

    # -- writing ---------------------------------------------------------------------------

    def _commit_batch(self, batch: list[Finish]) -> list[list[int] | BaseException]:
        """Writer thread: commit the finishes in one transaction.

        Each finish sits in its own SAVEPOINT, so one failing finish is rolled back alone
        while the others commit; all share one fsync, which is what bounds the write rate.
        """
        conn = self._writer
        outcomes: list[list[int] | BaseException] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            for rows, outcome in batch:
                conn.execute("SAVEPOINT finish")
                try:
                    # BEGIN IMMEDIATE holds the file's write lock: no other writer, in this process
                    # or another, can store the rollout between this check and the commit.
                    refuse_stored_rollout(conn, outcome)
                    cursors = [conn.execute(_INSERT, row).lastrowid for row in rows]
                    if outcome is not None:
                        conn.execute(
                            "INSERT INTO outcomes (session_id, tenant, doc, rollout_id) VALUES (?, ?, ?, ?)",
                            (outcome.session_id, outcome.tenant, outcome.doc(cursors), outcome.rollout_id),
                        )
                    outcomes.append(cursors)
                except Exception as exc:
                    conn.execute("ROLLBACK TO finish")
                    outcomes.append(exc)
                conn.execute("RELEASE finish")
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            outcomes = [exc] * len(batch)
        return outcomes

    def _query(self, sql: str, args: tuple[Any, ...] | list[Any]) -> list[tuple[Any, ...]]:
        return self._reader.execute(sql, args).fetchall()

    def _repoll_s(self) -> float | None:
        # Only another process writing the same file commits without waking this one's events.
        return CROSS_PROCESS_POLL_S

    def stored_sessions_sync(self, session_ids: list[str]) -> set[str]:
        """Which of `session_ids` are closed in the store: samples or an outcome committed."""
        found: set[str] = set()
        for i in range(0, len(session_ids), 250):  # SQLite's bound-parameter limit
            chunk = session_ids[i : i + 250]
            marks = ",".join("?" * len(chunk))
            query = (
                f"SELECT DISTINCT session_id FROM samples WHERE session_id IN ({marks}) "
                f"UNION SELECT session_id FROM outcomes WHERE session_id IN ({marks})"
            )
            found.update(r[0] for r in self._reader.execute(query, chunk + chunk))
        return found

    async def ready(self) -> None:
        """Raise unless the file can be written now (for /readyz)."""
        await asyncio.to_thread(check_writable, self.path)

    async def close(self) -> None:
        """Close both connections (checkpointing the WAL) after pending work finishes."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.close_sync)

    def close_sync(self) -> None:
        """Synchronous `close`, for code without an event loop."""
        self._write_pool.shutdown(wait=True)
        self._read_pool.shutdown(wait=True)
        if self._reader is not self._writer:
            self._reader.close()
        self._writer.close()
