"""The trajectory store's interface, and opening the one a `--store` value names.

`Store` is what the gateway, the trajectory API, the viewer and the CLI use; two backends
implement it: `store.TrajectoryStore` (SQLite in the data dir, the embedded default) and
`pg_store.PgTrajectoryStore` (PostgreSQL, shared by a fleet of gateways). This module owns the
choice between them, not either one's storage.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from rlgw.gateway.sample import Sample
from rlgw.gateway.trajectories.pg_store import PgTrajectoryStore, is_url
from rlgw.gateway.trajectories.store import OutcomeFn, SampleSummary, StoredSample, TrajectoryStore


class Store(Protocol):
    """Finished samples by commit-ordered cursor per tenant, and each closed session's outcome."""

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
    ) -> list[int]: ...
    async def list(self, tenant: str, *, after: int = 0, limit: int = 100) -> list[StoredSample]: ...
    async def get(self, tenant: str, cursor: int) -> StoredSample | None: ...
    async def summaries(self, tenant: str | None, **kwargs: Any) -> list[SampleSummary]: ...
    async def stored_sessions(self, session_ids: list[str]) -> set[str]: ...
    async def outcome(self, tenant: str, session_id: str) -> dict[str, Any] | None: ...
    async def finished_rollout(self, tenant: str, rollout_id: str) -> dict[str, Any] | None: ...
    async def wait(self, tenant: str, *, after: int, timeout: float) -> None: ...  # noqa: ASYNC109
    async def ready(self) -> None: ...
    async def close(self) -> None: ...
    def list_sync(self, tenant: str | None, *, after: int = 0, limit: int = 100) -> list[StoredSample]: ...
    def get_sync(self, tenant: str | None, cursor: int) -> StoredSample | None: ...
    def count_sync(self, tenant: str | None, *, after: int = 0) -> int: ...
    def iter_sync(self, tenant: str | None, *, after: int = 0, batch: int = 64) -> Iterator[StoredSample]: ...
    def close_sync(self) -> None: ...


def open_store(location: str | None, data_dir: Path) -> Store:
    """The store at `location` (a `postgresql://` URL), else SQLite in `data_dir`."""
    if location and is_url(location):
        return PgTrajectoryStore.open(location)
    return TrajectoryStore.open(Path(location) if location else data_dir)


def open_store_readonly(location: str | None, data_dir: Path) -> Store:
    """`open_store`, read-only (the CLI); raises `StoreError` where there is no store."""
    if location and is_url(location):
        return PgTrajectoryStore.open_readonly(location)
    return TrajectoryStore.open_readonly(Path(location) if location else data_dir)
