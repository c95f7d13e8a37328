"""The session journal: every open session and every committed turn, durable before the agent
gets its answer, so a gateway killed mid-rollout restarts with its sessions as they were.

Two parts in the data dir:
- `journal.sqlite3` (WAL): one row per open session, its settings and its key's SHA-256 digest
  (never the key); written when a session opens and when it closes.
- `journal-turns/<session id>.log`: one append-only file per open session, one frame per
  committed turn (length, CRC-32, the record as JSON): what the turn did to the ledger.

A turn's frame is written before the turn is applied and answered; a turn still generating
when the process dies has no frame and is simply absent (the agent's retry regenerates it). A
frame the kill cut short fails its length or CRC and is dropped on restore, and cut off before
the next append. `finish` and `delete` remove the session's row, then its file, once its
samples are in the store (or it is gone), so the journal holds open sessions only; a file left
without a row (a kill between the two) is removed at start-up.

Why files, not a `turns` table (the first design; measured with bench/journal.py and under
bench/gateway.py's load, where the SQLite insert was the gateway's largest own cost): a turn
row of about 6 KB took two B-tree inserts, an overflow page and, every ~80 turns, a WAL
checkpoint inside the turn (22 us p50 and 420 us p99 alone; 7.7% of the gateway's CPU under
load); an append is one `write` (11 us p50, 65 us p99, no checkpoints) and a finish one unlink.

Durability: `normal` (the default) survives a killed process, which is what a `kill -9` or an
OOM kill is: every frame and row is in the OS's cache before the turn is answered, and nothing
is fsynced (after a power loss the journal may be lost or unreadable, and start-up fails on
it). `full` also survives power loss, at the cost of an fsync per turn, on one dedicated thread
so the event loop never waits on it. Several gateways on one host may share a data dir: a
gateway asked for a session it does not hold restores it from here (`load`).

This module knows the ledger's records, not HTTP or the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import sqlite3
import struct
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from rlgw.gateway.metrics import JOURNAL_WRITE_SECONDS
from rlgw.gateway.trajectories.store import check_writable

log = logging.getLogger(__name__)

FILENAME = "journal.sqlite3"
TURNS_DIR = "journal-turns"
CHECKPOINT_PAGES = 256  # "normal": a checkpoint (no fsync) every 1 MiB of WAL
_FRAME = struct.Struct("<II")  # payload length, CRC-32 of the payload
# Session ids that can name a file (the gateway mints `s-<hex>`); any other id has no turns.
_FILE_SAFE = re.compile(r"[A-Za-z0-9_-]{1,128}")
# Turn files held open for appending, the most recently written first; beyond this many the least
# recent is closed (a gateway's file limit also covers its agents' and the engine's sockets).
OPEN_FILES = 256
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC


@dataclass(slots=True)
class JournaledSession:
    """One open session as the journal holds it: its settings, key digest and turn records."""

    doc: dict[str, Any]
    key_digest: bytes
    turns: list[dict[str, Any]]


def read_frames(data: bytes) -> tuple[list[bytes], int]:
    """The whole frames at the start of `data` and where they end (a cut or corrupt tail is left)."""
    out, at, size = [], 0, len(data)
    while at + _FRAME.size <= size:
        length, crc = _FRAME.unpack_from(data, at)
        end = at + _FRAME.size + length
        if end > size:
            break
        payload = data[at + _FRAME.size : end]
        if zlib.crc32(payload) != crc:
            break
        out.append(payload)
        at = end
    return out, at


class SessionJournal:
    """Journal of open sessions and their committed turns (see the module docstring)."""

    shared = False  # gateways sharing a data dir are not told so (see README, Deployment)

    def __init__(self, path: Path, *, sync: str = "normal") -> None:
        if sync not in ("normal", "full"):
            raise ValueError("journal sync must be 'normal' or 'full'")
        self.path = path
        self.turns_dir = path.parent / TURNS_DIR
        self.turns_dir.mkdir(exist_ok=True)
        self._full = sync == "full"
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA busy_timeout=10000")
        if sync == "normal":
            # A killed process loses nothing the OS holds: no fsync, checkpoints included.
            self._conn.execute("PRAGMA synchronous=OFF")
            self._conn.execute(f"PRAGMA wal_autocheckpoint={CHECKPOINT_PAGES}")
        else:
            self._conn.execute("PRAGMA synchronous=FULL")  # every write and checkpoint on the writer thread
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, doc BLOB NOT NULL, key BLOB NOT NULL)"
        )
        self._conn.execute("CREATE INDEX IF NOT EXISTS sessions_by_key ON sessions (key)")
        self._lock = threading.Lock()
        # Where each session's file ends after its last whole frame, as this process knows it:
        # anything past it (a frame a kill cut short) is cut off before the next append.
        self._ends: dict[str, int] = {}
        # Sessions whose file may run past `_ends` (a cut frame found by `load`, a failed append):
        # their next append looks at the file's size first. Other appends trust `_ends`.
        self._unsure: set[str] = set()
        # Open descriptors of recently appended files: an open, stat and close per turn cost
        # about 50 us of a turn under load here (cold caches), three syscalls for one write.
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._turns_dir = str(self.turns_dir)
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlgw-journal")
        self.write_seconds = 0.0  # total time spent writing turns (for the metrics)
        self.writes = 0
        self._closed = False
        self._migrate_turn_rows()

    @classmethod
    def open(cls, data_dir: Path, *, sync: str = "normal") -> SessionJournal:
        """The journal of `data_dir` (created if missing)."""
        data_dir.mkdir(parents=True, exist_ok=True)
        return cls(data_dir / FILENAME, sync=sync)

    def _turns_path(self, session_id: str) -> str | None:
        return f"{self._turns_dir}/{session_id}.log" if _FILE_SAFE.fullmatch(session_id) else None

    def _migrate_turn_rows(self) -> None:
        """Move a journal of the first design (a `turns` table) into turn files, then drop the table.

        Each file is written whole and renamed into place, so a kill during the move only means
        doing it again at the next start.
        """
        has_rows = self._conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'turns'"
        ).fetchone()
        if has_rows is None:
            return
        sessions = [r[0] for r in self._conn.execute("SELECT DISTINCT session FROM turns")]
        for sid in sessions:
            path = self._turns_path(sid)
            if path is None:
                continue
            rows = self._conn.execute("SELECT doc FROM turns WHERE session = ? ORDER BY seq", (sid,))
            data = b"".join(_FRAME.pack(len(d), zlib.crc32(d)) + bytes(d) for (d,) in rows)
            tmp = path.removesuffix(".log") + ".tmp"
            Path(tmp).write_bytes(data)
            if self._full:
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        self._conn.execute("DROP TABLE turns")
        log.info("journal turns moved to files", extra={"fields": {"sessions": len(sessions)}})

    def _append(self, session_id: str, payload: bytes) -> None:
        """Append one frame to the session's file; on any failure the file is as it was."""
        if self._closed:
            raise RuntimeError("the journal is closed")
        path = self._turns_path(session_id)
        if path is None:
            raise ValueError(f"session id {session_id!r} cannot name a journal file")
        frame = _FRAME.pack(len(payload), zlib.crc32(payload)) + payload
        started = time.perf_counter()
        with self._lock:
            fd = self._fds.pop(session_id, None)
            end = self._ends.get(session_id)
            unsure = session_id in self._unsure
        if fd is None:
            fd = os.open(path, _APPEND, 0o600)
        try:
            if end is None:  # a session this process neither opened nor loaded
                end = os.fstat(fd).st_size
            elif unsure and os.fstat(fd).st_size != end:
                os.ftruncate(fd, end)  # a frame cut short by a kill: the next one follows the last whole one
            try:
                written = os.write(fd, frame)
                if written != len(frame):
                    raise OSError(f"short write to the journal ({written} of {len(frame)} bytes)")
                if self._full:
                    os.fsync(fd)
            except BaseException:
                os.ftruncate(fd, end)
                raise
        except BaseException:
            os.close(fd)
            with self._lock:
                self._unsure.add(session_id)  # the cut-back may itself have failed
            raise
        if self._full and end == 0:
            self._sync_dir()  # the new file's name survives a power loss too
        with self._lock:
            self._ends[session_id] = end + len(frame)
            self._unsure.discard(session_id)
            self._fds[session_id] = fd
            evicted = self._fds.popitem(last=False)[1] if len(self._fds) > OPEN_FILES else None
        if evicted is not None:
            os.close(evicted)
        elapsed = time.perf_counter() - started
        self.write_seconds += elapsed
        self.writes += 1
        JOURNAL_WRITE_SECONDS.observe(elapsed)

    def _sync_dir(self) -> None:
        fd = os.open(self.turns_dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _remove_turns(self, session_id: str) -> None:
        with self._lock:
            self._ends.pop(session_id, None)
            self._unsure.discard(session_id)
            fd = self._fds.pop(session_id, None)
        if fd is not None:
            os.close(fd)  # before the unlink: a later append must not write into a removed file
        path = self._turns_path(session_id)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def _run(self, sql: str, args: tuple[Any, ...]) -> None:
        with self._lock:
            self._conn.execute(sql, args)

    async def _write(self, fn: Callable[..., None], *args: Any) -> None:
        if not self._full:
            # Without an fsync an append is microseconds: cheaper on the loop than the hand-off
            # to a thread and back (measured with bench/journal.py).
            fn(*args)
            return
        loop = asyncio.get_running_loop()
        # Shielded: a turn whose client leaves while its frame is being written still gets the
        # frame (the turn is then applied; a retry replaces it), never half of one.
        await asyncio.shield(loop.run_in_executor(self._writer, fn, *args))

    async def opened(self, session_id: str, doc: dict[str, Any], key_digest: bytes) -> None:
        """Record a new session (before its id and key are handed out)."""
        with self._lock:
            self._ends[session_id] = 0
        await self._write(
            self._run,
            "INSERT OR REPLACE INTO sessions (id, doc, key) VALUES (?, ?, ?)",
            (session_id, orjson.dumps(doc), key_digest),
        )

    async def turn(self, session_id: str, record: dict[str, Any], *, index: int | None = None) -> None:
        """Record one committed turn of `session_id` (`index` is for shared journals: one data dir has
        one writer, whose copy is never stale)."""
        await self._write(self._append, session_id, orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY))

    async def closed(self, session_id: str) -> None:
        """Forget a session (finished and stored, deleted, or expired): its row, then its turns."""
        await self._write(self.forget, session_id)

    def forget(self, session_id: str) -> None:
        """`closed`, blocking. The row goes first: a kill between the two leaves a file without a
        row, which start-up removes, never a row without its turns."""
        self._run("DELETE FROM sessions WHERE id = ?", (session_id,))
        self._remove_turns(session_id)

    def load(self, session_id: str) -> JournaledSession | None:
        """One open session, or None (blocking: reads its file; used on a miss and at start-up)."""
        with self._lock:
            row = self._conn.execute("SELECT doc, key FROM sessions WHERE id = ?", (session_id,)).fetchone()
        if row is None:
            return None
        path = self._turns_path(session_id)
        try:
            data = Path(path).read_bytes() if path is not None else b""
        except FileNotFoundError:
            data = b""
        frames, end = read_frames(data)
        if end != len(data):
            log.warning(
                "journal: a cut or corrupt frame at the end of a session's turns was dropped",
                extra={"fields": {"session": session_id, "turns": len(frames), "bytes": len(data) - end}},
            )
        with self._lock:
            self._ends[session_id] = end
            if end != len(data):
                self._unsure.add(session_id)
        return JournaledSession(orjson.loads(row[0]), bytes(row[1]), [orjson.loads(f) for f in frames])

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
        """Every open session, oldest first (at start-up); turn files without a session are removed.

        The files are listed before the rows: a row is written before its session's first frame
        and deleted before its file, so a file whose row is gone by then is a closed session's.
        """
        files = {p.stem for p in self.turns_dir.glob("*.log")}
        ids = self.session_ids()
        for orphan in files - set(ids):
            self._remove_turns(orphan)
        return [s for s in (self.load(i) for i in ids) if s is not None]

    async def ready(self) -> None:
        """Raise unless the journal's database can be written now (for /readyz); writes nothing."""
        await asyncio.to_thread(check_writable, self.path)

    def close(self) -> None:
        """Finish pending writes and close the database; later writes fail."""
        self._writer.shutdown(wait=True)
        with self._lock:
            self._closed = True
            self._conn.close()
            fds, self._fds = list(self._fds.values()), OrderedDict()
        for fd in fds:
            os.close(fd)
