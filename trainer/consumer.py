"""The trajectory consumer: read the gateway's stream, acknowledge, resume, and turn samples into rollouts.

Reading: `GatewayClient.trajectories` from the last acknowledged cursor. Acknowledging: after a
step has trained on its samples, `ack(cursor)` writes the cursor to a small state file (atomic
replace + fsync). After a trainer restart the consumer starts from that cursor: what was read
but not acknowledged is read again (no loss), what was acknowledged never is (no duplicates);
within one process each cursor is yielded once. Cursors are committed in increasing order by the
store, so nothing below a seen cursor can appear later.

Turning samples into rollouts: segments are grouped by `rollout_id` (one denominator), rollouts
by `group_index` (one GRPO group); each status maps to an explicit action (`AcceptancePolicy`);
tokens sampled by a policy more than `max_staleness` versions older than the trainer's are masked
out (a rollout left without trainable tokens is dropped). This module knows nothing about models.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlgw.gateway.sample import Sample, SampleStatus
from rlgw.gateway.trajectories.client import GatewayClient, StoredTrajectory
from rlgw.trainer.rollout import Rollout


class Action(enum.StrEnum):
    """What a status does to a rollout: train on it, train on it with reward 0, or drop it."""

    KEEP = "keep"
    ZERO_REWARD = "zero_reward"
    DROP = "drop"


_STRICTNESS = {Action.KEEP: 0, Action.ZERO_REWARD: 1, Action.DROP: 2}


@dataclass(frozen=True, slots=True)
class AcceptancePolicy:
    """The action per sample status. A rollout takes the strictest action among its segments.

    Defaults: completed and truncated runs train (a length cut is the policy's own doing);
    aborted runs (stopped from outside) and failed ones (infrastructure) say nothing about the
    policy and are dropped.
    """

    completed: Action = Action.KEEP
    truncated: Action = Action.KEEP
    aborted: Action = Action.DROP
    failed: Action = Action.DROP

    def action(self, status: SampleStatus) -> Action:
        """The action for one status."""
        return Action(getattr(self, str(status)))


class ConsumerTimeout(TimeoutError):
    """The stream did not reach the expected cursor in time."""


@dataclass(slots=True)
class ConsumeStats:
    """What `to_rollouts` did with a batch of samples (for the iteration's receipt)."""

    samples_by_status: dict[str, int] = field(default_factory=dict)
    rollouts_kept: int = 0
    rollouts_dropped: dict[str, int] = field(default_factory=dict)
    stale_tokens_masked: int = 0
    max_staleness: int = 0

    def to_dict(self) -> dict:
        """Plain values."""
        return dataclasses.asdict(self)


class CursorFile:
    """The acknowledged cursor, persisted atomically (a crash leaves the old or the new value)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> int:
        """The acknowledged cursor (0: nothing acknowledged yet)."""
        try:
            return int(self.path.read_text().strip() or 0)
        except FileNotFoundError:
            return 0

    def save(self, cursor: int) -> None:
        """Write `cursor` durably."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(f"{cursor}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


class TrajectoryConsumer:
    """Reads samples in cursor order from the last acknowledged cursor; see the module docstring."""

    def __init__(self, client: GatewayClient, state_path: Path, *, poll_wait: float = 5.0) -> None:
        self.client = client
        self.cursor_file = CursorFile(state_path)
        self.acked = self.cursor_file.load()
        self.read_upto = self.acked
        self.poll_wait = poll_wait

    async def read_through(self, cursor: int, within: float = 120.0) -> list[StoredTrajectory]:
        """Every sample after what this consumer has read, up to and including `cursor`.

        Raises `ConsumerTimeout` if the stream does not reach `cursor` within `within` seconds;
        nothing counts as read then (the next call starts from the same place).
        """
        out: list[StoredTrajectory] = []
        start = self.read_upto
        if cursor <= start:
            return out
        try:
            async with asyncio.timeout(within):
                stream = self.client.trajectories(after=start, wait=self.poll_wait)
                async with contextlib.aclosing(stream):
                    async for item in stream:
                        out.append(item)
                        if item.cursor >= cursor:
                            self.read_upto = item.cursor
                            return out
        except TimeoutError:
            pass
        last = out[-1].cursor if out else start
        raise ConsumerTimeout(f"the trajectory stream reached cursor {last}, not {cursor}, in {within}s")

    def ack(self, cursor: int) -> None:
        """Everything up to `cursor` has been trained on: never deliver it again, even after a restart."""
        if cursor > self.acked:
            self.cursor_file.save(cursor)
            self.acked = cursor


def version_number(version: str) -> int | None:
    """A weight version as a number ("3", "weight_v000003"), or None when it is not one ("default")."""
    text = version.removeprefix("weight_v")
    return int(text) if text.isdigit() else None


def mask_stale_tokens(sample: Sample, current: int, max_staleness: int) -> tuple[Sample, int, int]:
    """A copy of `sample` with tokens older than `current - max_staleness` masked out.

    Returns (sample, masked tokens, largest staleness seen on a trainable token). A token whose
    version is not a number cannot be shown to be fresh and counts as stale.
    """
    mask = sample.loss_mask.copy()
    worst = 0
    for span in sample.weight_versions:
        v = version_number(span.version)
        age = current - v if v is not None else max_staleness + 1
        if mask[span.start : span.end].any():
            worst = max(worst, age)
        if age > max_staleness:
            mask[span.start : span.end] = 0
    masked = int(sample.loss_mask.sum() - mask.sum())
    if not masked:
        return sample, 0, worst
    return dataclasses.replace(sample, loss_mask=mask), masked, worst


def to_rollouts(
    items: list[StoredTrajectory],
    policy: AcceptancePolicy,
    *,
    current_version: int | None = None,
    max_staleness: int | None = None,
) -> tuple[list[Rollout], ConsumeStats]:
    """Group samples into rollouts (by `rollout_id`, segments in order) and apply the policies."""
    stats = ConsumeStats()
    stats.samples_by_status = dict(Counter(str(t.sample.status) for t in items))
    by_rollout: dict[str, list[StoredTrajectory]] = defaultdict(list)
    for t in items:
        by_rollout[t.sample.rollout_id].append(t)
    dropped: Counter[str] = Counter()
    out: list[Rollout] = []
    for rollout_id, parts in by_rollout.items():
        parts.sort(key=lambda t: (t.session_id, t.segment))
        samples = [t.sample for t in parts]
        action = max((policy.action(s.status) for s in samples), key=_STRICTNESS.__getitem__)
        if action is Action.DROP:
            dropped[f"status_{max(samples, key=lambda s: _STRICTNESS[policy.action(s.status)]).status}"] += 1
            continue
        rewards = {s.reward for s in samples}
        if None in rewards or len(rewards) != 1:
            dropped["no_reward" if None in rewards else "reward_mismatch"] += 1
            continue
        if max_staleness is not None and current_version is not None:
            fresh = []
            for s in samples:
                s2, masked, worst = mask_stale_tokens(s, current_version, max_staleness)
                stats.stale_tokens_masked += masked
                stats.max_staleness = max(stats.max_staleness, worst)
                if s2.loss_mask.any():
                    fresh.append(s2)
            samples = fresh
            if not samples:
                dropped["stale"] += 1
                continue
        reward = 0.0 if action is Action.ZERO_REWARD else float(samples[0].reward)  # type: ignore[arg-type]
        out.append(Rollout(rollout_id, int(samples[0].group_index), reward, samples))
    stats.rollouts_kept = len(out)
    stats.rollouts_dropped = dict(dropped)
    return out, stats


def reward_stats(rollouts: list[Rollout]) -> tuple[float | None, float | None]:
    """Mean and std of the rollouts' rewards (None when there are none)."""
    if not rollouts:
        return None, None
    r = np.array([x.reward for x in rollouts], dtype=np.float64)
    return float(r.mean()), float(r.std())
