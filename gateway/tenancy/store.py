"""Tenants the admin manages, persisted in the data dir: name, key digest, limits.

One small SQLite file (`tenants.sqlite3`, WAL) beside the trajectory store, kept apart from
it so each has its own schema and writer: admin changes are rare and tiny, samples are large
and batched. Keys are generated here, returned once, and stored only as their SHA-256 digest.
Several gateway processes on one data dir see each other's changes: `changed()` is a cheap
check (`PRAGMA data_version`) a process polls before re-reading the table.

This module owns the file and its rows; it knows nothing about HTTP, or about how digests
are matched to callers (`tenants.KeyTable`).
"""

from __future__ import annotations

import re
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rlgw.gateway.errors import Conflict, InvalidRequest
from rlgw.gateway.tenancy.limits import Limits
from rlgw.gateway.tenancy.tenants import key_digest

DB_NAME = "tenants.sqlite3"
KEY_PREFIX = "sk-rlgw-t-"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tenants (
    name TEXT PRIMARY KEY,
    key_digest BLOB NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    open_sessions INTEGER,
    in_flight INTEGER,
    tokens_per_minute INTEGER
);
"""


@dataclass(frozen=True, slots=True)
class Tenant:
    """A stored tenant (its key is never kept, only the key's digest)."""

    name: str
    key_digest: bytes
    created_at: float
    limits: Limits

    def to_dict(self) -> dict[str, object]:
        """The admin API's view (no digest: it is not needed and says nothing useful)."""
        return {"name": self.name, "created_at": self.created_at, "limits": self.limits.to_dict()}


def check_name(name: str) -> str:
    """`name` if it is a valid tenant name (letters, digits, `._-`, at most 64), else 400."""
    if not NAME_RE.fullmatch(name):
        raise InvalidRequest(
            "a tenant name is 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
            param="name",
        )
    return name


class TenantStore:
    """The tenants table; every method is synchronous and short (run it off the event loop)."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self._conn = conn
        self._lock = threading.Lock()  # one connection, used from worker threads
        self._seen_version = -1

    @classmethod
    def open(cls, data_dir: Path) -> TenantStore:
        """Open (creating if needed) `data_dir/tenants.sqlite3`."""
        data_dir.mkdir(parents=True, exist_ok=True)
        path = data_dir / DB_NAME
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA busy_timeout=5000")
        conn.executescript(_SCHEMA)
        return cls(path, conn)

    def add(self, name: str, limits: Limits) -> tuple[Tenant, str]:
        """Create tenant `name` with a new key; returns it and the key (shown once). 409 if it exists."""
        check_name(name)
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        tenant = Tenant(name, key_digest(key), time.time(), limits)
        try:
            with self._lock:
                self._conn.execute(
                    "INSERT INTO tenants VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        name,
                        tenant.key_digest,
                        tenant.created_at,
                        limits.open_sessions,
                        limits.in_flight,
                        limits.tokens_per_minute,
                    ),
                )
        except sqlite3.IntegrityError:
            raise Conflict(f"tenant {name!r} exists", param="name", code="tenant_exists") from None
        return tenant, key

    def set_limits(self, name: str, limits: Limits) -> bool:
        """Replace tenant `name`'s own limits (its key is unchanged); False if there is no such tenant."""
        with self._lock:
            cur = self._conn.execute(
                "UPDATE tenants SET open_sessions = ?, in_flight = ?, tokens_per_minute = ? WHERE name = ?",
                (limits.open_sessions, limits.in_flight, limits.tokens_per_minute, name),
            )
        return cur.rowcount > 0

    def revoke(self, name: str) -> bool:
        """Delete tenant `name` (its key stops working); False if there was none."""
        with self._lock:
            cur = self._conn.execute("DELETE FROM tenants WHERE name = ?", (name,))
        return cur.rowcount > 0

    def list(self) -> list[Tenant]:
        """Every tenant, by name."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT name, key_digest, created_at, open_sessions, in_flight, tokens_per_minute "
                "FROM tenants ORDER BY name"
            ).fetchall()
            self._seen_version = self._data_version()
        return [Tenant(r[0], bytes(r[1]), r[2], Limits(r[3], r[4], r[5])) for r in rows]

    def _data_version(self) -> int:
        return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def changed(self) -> bool:
        """Whether another connection changed the table since the last `list()` (cheap)."""
        with self._lock:
            return self._data_version() != self._seen_version

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()
