"""Engine-host side of disk sync: bring a host-local checkpoint to a target version, crash-safely.

`pull(source, target, local)` resolves the cheapest chain (the newest full version at or below the
target in `source`, or the local checkpoint if it is at least as new), copies and verifies the full
version, applies the deltas in order, and only then renames the finished directory into place:
    local/.tmp-weight_vT-xxxx   (staged; every digest verified)  ->  local/weight_vT   (committed)
The committed local versions are never modified, so a crash at any point leaves the previous version
intact and a retry starts over cleanly; a version already committed is a no-op (an XOR is never
applied twice). Pulls into one local directory are serialized by a lock file. Reloading the engine is
the caller's job (`rlgw.sync.engine_routes`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rlgw.sync import checkpoint as ck
from rlgw.sync.delta import apply_delta
from rlgw.sync.errors import CheckpointError, VersionError
from rlgw.sync.fileio import Progress
from rlgw.sync.full import copy_verified, verify_version

log = logging.getLogger(__name__)


@dataclass(slots=True)
class PullResult:
    """Outcome of a pull: the verified full directory to load and how it was reached."""

    version: int
    path: Path
    checkpoint_digest: str
    already: bool = False  # the local checkpoint was already at the target: nothing was written
    chain: list[int] = field(default_factory=list)  # versions applied: a full one first, then deltas
    seconds: float = 0.0


def committed_versions(local: Path) -> list[ck.VersionInfo]:
    """The committed full versions in a host-local checkpoint directory, oldest first."""
    return [v for v in ck.list_versions(local) if v.kind == "full"]


@contextlib.contextmanager
def _locked(local: Path) -> Iterator[None]:
    local.mkdir(parents=True, exist_ok=True)
    with open(local / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def plan_chain(
    source: Path, target: int, local_version: int | None
) -> tuple[ck.VersionInfo | None, list[ck.VersionInfo]]:
    """(full version to start from, or None to start from the local one; deltas to apply in order).

    Raises `VersionError` for an unpublished target, a missing delta, or a delta whose declared base
    is not the version before it (out of order).
    """
    published = {v.version: v for v in ck.list_versions(source)}
    if target not in published:
        raise VersionError(f"v{target} is not published in {source}")
    fulls = [v for n, v in sorted(published.items()) if v.kind == "full" and n <= target]
    start_full = fulls[-1] if fulls else None
    if local_version is not None and (start_full is None or local_version >= start_full.version):
        start, first = None, local_version
    elif start_full is not None:
        start, first = start_full, start_full.version
    else:
        raise VersionError(f"no full version at or below v{target} in {source}, and no local checkpoint")
    deltas = []
    for n in range(first + 1, target + 1):
        v = published.get(n)
        if v is None:
            raise VersionError(
                f"cannot reach v{target} from v{first}: delta v{n} is not published in {source}"
            )
        if v.kind != "delta" or v.base_version != n - 1:
            raise VersionError(
                f"out-of-order chain: v{n} is a {v.kind} with base v{v.base_version}, "
                f"expected a delta on v{n - 1}"
            )
        deltas.append(v)
    return start, deltas


def pull(
    source: Path,
    target: int,
    local: Path | None,
    workers: int | None = None,
    keep_local: int = 2,
    durable: bool = True,
    progress: Progress | None = None,
) -> PullResult:
    """Make `target` available as a verified full directory; see the module docstring.

    With `local=None` the target must be a full version and is verified in place in `source`.
    `progress(nbytes)` is called as tensors complete. `keep_local` committed versions stay in
    `local` (at least 2: the target and its base, so a retry or a rollback never needs the
    network); `durable=False` skips fsync (tests, benches).
    """
    if keep_local < 2:
        raise ValueError("keep_local must be >= 2")
    t0 = time.perf_counter()
    if local is None:
        path = source / ck.version_dirname(target)
        index = verify_version(path, workers, progress)
        return PullResult(
            target, path, index.checkpoint_digest, chain=[target], seconds=time.perf_counter() - t0
        )
    with _locked(local):
        for stale in local.glob(".tmp-weight_v*"):
            # Left by a crash between staging and the swap; never trusted, never reused.
            log.warning("removing stale staging dir", extra={"fields": {"path": str(stale)}})
            shutil.rmtree(stale, ignore_errors=True)
        committed = committed_versions(local)
        current = committed[-1] if committed else None
        if current is not None and current.version == target:
            index = ck.read_index(current.path)
            return PullResult(target, current.path, index.checkpoint_digest, already=True)
        if current is not None and current.version > target:
            raise VersionError(f"local checkpoint is v{current.version}, newer than the requested v{target}")
        start, deltas = plan_chain(source, target, current.version if current else None)
        final = local / ck.version_dirname(target)
        chain: list[int] = []
        stages: list[Path] = []
        # The oldest committed version we will not keep becomes the output's files (see atomic_dir).
        retired = committed[: max(0, len(committed) + 1 - keep_local)]
        recycle = retired[0].path if retired else None
        try:
            with ck.atomic_dir(final, durable=durable, recycle=recycle) as out:
                base = current.path if current else None
                if start is not None:
                    stage = out if not deltas else _stage_dir(local, start.version)
                    stages.append(stage)
                    copy_verified(start.path, stage, workers, progress)
                    base, chain = stage, [start.version]
                for i, d in enumerate(deltas):
                    stage = out if i == len(deltas) - 1 else _stage_dir(local, d.version)
                    stages.append(stage)
                    try:
                        apply_delta(base, d.path, stage, workers, progress)
                    except VersionError as exc:
                        if start is None and i == 0:  # the local checkpoint was the base
                            raise VersionError(
                                f"{exc} (the local v{current.version} in {local} is not the trainer's base: "
                                "pull a full version into an empty local directory to repair it)"
                            ) from exc
                        raise
                    base = stage
                    chain.append(d.version)
                _before_swap(out)
        finally:
            for stage in stages[:-1]:
                shutil.rmtree(stage, ignore_errors=True)
        for old in retired[1:]:
            shutil.rmtree(old.path, ignore_errors=True)
        index = ck.read_index(final)
        result = PullResult(
            target, final, index.checkpoint_digest, chain=chain, seconds=time.perf_counter() - t0
        )
        log.info(
            "pulled weights",
            extra={"fields": {"version": target, "chain": chain, "seconds": round(result.seconds, 3)}},
        )
        return result


def _stage_dir(local: Path, version: int) -> Path:
    path = local / f".tmp-{ck.version_dirname(version)}-{os.getpid()}-{time.monotonic_ns()}"
    path.mkdir()
    return path


def _before_swap(staged: Path) -> None:
    """Last point before the staged directory is renamed into place (tests simulate crashes here)."""
    if not (staged / ck.INDEX_NAME).is_file():
        raise CheckpointError(f"{staged}: staged version has no index")
