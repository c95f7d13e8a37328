"""Fleet check: which version (and which bytes) each engine serves, and whether they all agree.

Reads `/model_info` (`weight_version`, falling back to SGLang 0.5.5's `/get_weight_version`) and, on
rlgw engines, `/weight_checkpoint` (last verified checkpoint digest and a digest of the live
weights). `check_fleet` turns any disagreement into `FleetMismatch`: after a sync, an engine on
another version, on another checkpoint, with other live bytes than its peers, or unreachable is an
error, never a warning. This module does not perform syncs (`rlgw.sync.client` does).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass

import httpx

from rlgw.sync.errors import FleetMismatch


@dataclass(slots=True)
class EngineStatus:
    """One engine's answer; `error` is set when it could not be read."""

    url: str
    weight_version: str | None = None
    checkpoint_digest: str | None = None
    live_digest: str | None = None
    checkpoint_dir: str | None = None
    error: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


async def engine_status(client: httpx.AsyncClient, url: str, live: bool = True) -> EngineStatus:
    """Read one engine's version and checkpoint; network and HTTP errors land in `error`."""
    st = EngineStatus(url)
    try:
        r = await client.get(f"{url}/model_info")
        if r.status_code == 404:
            r = await client.get(f"{url}/get_weight_version")
        r.raise_for_status()
        st.weight_version = r.json().get("weight_version")
        r = await client.get(f"{url}/weight_checkpoint", params={"live": "true" if live else "false"})
        if r.status_code != 404:  # plain SGLang engines have no such route
            r.raise_for_status()
            doc = r.json()
            st.checkpoint_digest, st.live_digest = doc.get("checkpoint_digest"), doc.get("live_digest")
            st.checkpoint_dir = doc.get("checkpoint_dir")
    except (httpx.HTTPError, ValueError) as exc:
        st.error = f"{type(exc).__name__}: {exc}"
    return st


async def fleet_status(urls: list[str], live: bool = True, http_timeout: float = 60.0) -> list[EngineStatus]:
    """Every engine's status, read concurrently (`http_timeout` per request)."""
    async with httpx.AsyncClient(timeout=http_timeout) as client:
        return list(await asyncio.gather(*(engine_status(client, u.rstrip("/"), live) for u in urls)))


def fleet_problems(
    statuses: list[EngineStatus], version: str | None = None, checkpoint_digest: str | None = None
) -> list[str]:
    """Every disagreement: unreachable engines, other versions or checkpoints, differing live bytes."""
    problems = []
    for s in statuses:
        if s.error:
            problems.append(f"{s.url}: unreadable ({s.error})")
        elif version is not None and s.weight_version != version:
            problems.append(f"{s.url}: serves version {s.weight_version!r}, expected {version!r}")
        elif checkpoint_digest is not None and s.checkpoint_digest != checkpoint_digest:
            problems.append(f"{s.url}: checkpoint digest {s.checkpoint_digest}, expected {checkpoint_digest}")
    versions = {s.weight_version for s in statuses if not s.error}
    if version is None and len(versions) > 1:
        problems.append(f"engines serve different versions: {sorted(map(str, versions))}")
    by_version: dict[str | None, set[str]] = {}
    for s in statuses:
        if s.live_digest is not None:
            by_version.setdefault(s.weight_version, set()).add(s.live_digest)
    for v, digests in by_version.items():
        if len(digests) > 1:
            problems.append(f"engines on version {v!r} serve different live weights ({len(digests)} digests)")
    return problems


def check_fleet(
    statuses: list[EngineStatus], version: str | None = None, checkpoint_digest: str | None = None
) -> None:
    """Raise `FleetMismatch` listing every problem `fleet_problems` finds."""
    problems = fleet_problems(statuses, version, checkpoint_digest)
    if problems:
        raise FleetMismatch("fleet check failed: " + "; ".join(problems))
