"""The session journal's interface, and opening the one a `--journal` value names.

`Journal` is what the session table, the session routes, finish and the turn lifecycle use; two
backends implement it: `journal.SessionJournal` (local files in the data dir, the default) and
`pg_journal.PgSessionJournal` (PostgreSQL, shared by a fleet of gateways). Both store the
same records; this module owns only the choice between them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from rlgw.gateway.sessions.journal import JournaledSession, SessionJournal
from rlgw.gateway.sessions.pg_journal import PgSessionJournal
from rlgw.gateway.trajectories.pg_store import is_url


class Journal(Protocol):
    """Open sessions and their committed turns, durable before the agent gets its answer."""

    write_seconds: float
    writes: int
    # Other gateways serve this journal's sessions too (a fleet): a gateway keeps no copy of a
    # session it opens, and restores one only when it serves it.
    shared: bool

    async def opened(self, session_id: str, doc: dict[str, Any], key_digest: bytes) -> None: ...
    async def turn(self, session_id: str, record: dict[str, Any], *, index: int | None = None) -> None: ...
    async def closed(self, session_id: str) -> None: ...
    async def ready(self) -> None: ...
    def forget(self, session_id: str) -> None: ...
    def load(self, session_id: str) -> JournaledSession | None: ...
    def session_for_key(self, key_digest: bytes) -> str | None: ...
    def session_ids(self) -> list[str]: ...
    def load_all(self) -> list[JournaledSession]: ...
    def close(self) -> None: ...


def open_journal(location: str | None, data_dir: Path, *, sync: str = "normal") -> Journal:
    """The journal at `location` (a `postgresql://` URL, or a dir), else the files in `data_dir`."""
    if location and is_url(location):
        return PgSessionJournal.open(location, sync=sync)
    return SessionJournal.open(Path(location) if location else data_dir, sync=sync)
