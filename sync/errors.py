"""The weight-sync error tree: every refusal in `rlgw.sync` is one of these.

    WeightSyncError
     ├── CheckpointError           a version directory is missing, malformed, truncated or unreadable
     │    └── DigestMismatch       bytes whose xxh3-128 digest differs from the recorded one
     ├── VersionError              the wrong version: a wrong base, an out-of-order or missing delta,
     │                             a version that already exists, a target older than the local state
     ├── TransferError             a broadcast or colocated hand-off failed part-way (nothing was applied)
     └── FleetMismatch             an engine reports another version or digest than the fleet should serve

Callers catch `WeightSyncError` to treat any sync failure as fatal for the step, or a branch to react
(e.g. a `DigestMismatch` on a shared mount means: re-pull, not re-train).
"""

from __future__ import annotations


class WeightSyncError(RuntimeError):
    """Base of every weight-sync failure."""


class CheckpointError(WeightSyncError):
    """A checkpoint or delta directory is missing, malformed, truncated or unreadable."""


class DigestMismatch(CheckpointError):
    """Tensor bytes do not match the xxh3-128 digest recorded in the index."""


class VersionError(WeightSyncError):
    """A version does not fit: wrong base, out-of-order or missing delta, or a version already taken."""


class TransferError(WeightSyncError):
    """A broadcast or colocated tensor hand-off failed; the engine keeps its previous weights."""


class FleetMismatch(WeightSyncError):
    """At least one engine serves a version or checkpoint digest other than the expected one."""
