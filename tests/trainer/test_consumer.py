"""The consumer against a real trajectory stream (uvicorn + SQLite store): ack, resume, grouping, policies."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from rlgw.gateway.sample import Sample, SampleStatus, VersionSpan
from rlgw.gateway.trajectories.client import GatewayClient, StoredTrajectory
from rlgw.gateway.trajectories.store import TrajectoryStore
from rlgw.trainer.consumer import (
    AcceptancePolicy,
    Action,
    ConsumerTimeout,
    TrajectoryConsumer,
    mask_stale_tokens,
    to_rollouts,
)
from tests.support.sample_factory import make_sample
from tests.support.trajectory_app import serve, trajectory_app


@pytest.fixture
async def served(tmp_path: Path):
    store = TrajectoryStore.open(tmp_path / "store")
    async with serve(trajectory_app(store, {"k": "t"})) as url:
        yield store, url
    await store.close()


async def add(store: TrajectoryStore, n: int, rng: np.random.Generator, session: str) -> list[int]:
    return await store.add_samples(
        "t", session, "task", [make_sample(rng, rollout_id=session) for _ in range(n)]
    )


async def test_ack_and_resume_after_restart_lose_nothing_and_repeat_nothing(served, tmp_path: Path) -> None:
    store, url = served
    rng = np.random.default_rng(0)
    state = tmp_path / "consumer.cursor"
    first = await add(store, 3, rng, "s1")
    second = await add(store, 2, rng, "s2")
    async with GatewayClient(url, "k") as gw:
        c = TrajectoryConsumer(gw, state, poll_wait=0.5)
        got = await c.read_through(first[-1])
        assert [t.cursor for t in got] == first
        c.ack(first[-1])  # trained on s1
        got = await c.read_through(second[-1])
        assert [t.cursor for t in got] == second  # each cursor once within a process
        assert await c.read_through(second[-1]) == []
        # crash before s2 was acknowledged: a new consumer re-reads s2, never s1
        c2 = TrajectoryConsumer(gw, state, poll_wait=0.5)
        assert c2.acked == first[-1]
        third = await add(store, 1, rng, "s3")
        got = await c2.read_through(third[-1])
        assert [t.cursor for t in got] == second + third
        c2.ack(third[-1])
        assert TrajectoryConsumer(gw, state).acked == third[-1]
        assert state.read_text().strip() == str(third[-1])


async def test_read_through_times_out_and_reads_again_from_the_same_place(served, tmp_path: Path) -> None:
    store, url = served
    rng = np.random.default_rng(1)
    cursors = await add(store, 2, rng, "s1")
    async with GatewayClient(url, "k") as gw:
        c = TrajectoryConsumer(gw, tmp_path / "c", poll_wait=0.2)
        with pytest.raises(ConsumerTimeout, match=f"reached cursor {cursors[-1]}"):
            await c.read_through(cursors[-1] + 5, within=1.0)
        assert c.read_upto == 0
        assert [t.cursor for t in await c.read_through(cursors[-1])] == cursors


def stored(sample: Sample, cursor: int, segment: int = 0, session: str | None = None) -> StoredTrajectory:
    return StoredTrajectory(cursor, session or sample.rollout_id, "task", segment, 0.0, sample)


def seg(rollout: str, group: int, status: str = "completed", reward: float | None = 1.0,
        versions: tuple[str, ...] = ("3",)) -> Sample:  # fmt: skip
    n = 4 * len(versions)
    spans = [VersionSpan(v, 4 * i, 4 * i + 4) for i, v in enumerate(versions)]
    return Sample(np.arange(n + 3, dtype=np.int32), n, np.ones(n, np.uint8), np.full(n, -0.5, np.float32),
                  reward, SampleStatus(status), rollout, group, spans)  # fmt: skip


def test_grouping_by_rollout_and_group_and_the_acceptance_policy() -> None:
    items = [
        stored(seg("a", 0), 1, 0),
        stored(seg("b", 0, "truncated", 0.0), 2),
        stored(seg("a", 0), 3, 1),  # a's second segment
        stored(seg("c", 1, "aborted"), 4),
        stored(seg("d", 1, "failed", 0.0), 5),
        stored(seg("e", 1, reward=None), 6),
        stored(seg("f", 2), 7, 0),
        stored(seg("f", 2, "aborted"), 8, 1),  # one aborted segment drops the whole rollout
    ]
    rollouts, stats = to_rollouts(items, AcceptancePolicy())
    assert [(r.rollout_id, r.group, len(r.segments), r.trainable_tokens) for r in rollouts] == [
        ("a", 0, 2, 8),
        ("b", 0, 1, 4),
    ]
    assert stats.samples_by_status == {"completed": 4, "truncated": 1, "aborted": 2, "failed": 1}
    assert stats.rollouts_dropped == {"status_aborted": 2, "status_failed": 1, "no_reward": 1}
    strict = AcceptancePolicy(truncated=Action.DROP, aborted=Action.ZERO_REWARD)
    rollouts, _ = to_rollouts(items, strict)
    assert {r.rollout_id: r.reward for r in rollouts} == {"a": 1.0, "c": 0.0, "f": 0.0}


def test_staleness_filter_masks_old_tokens_and_drops_what_is_left_empty() -> None:
    mixed = seg("a", 0, versions=("1", "2", "3"))
    masked, n, worst = mask_stale_tokens(mixed, current=3, max_staleness=1)
    assert n == 4 and worst == 2
    assert masked.loss_mask.tolist() == [0] * 4 + [1] * 8
    assert mixed.loss_mask.sum() == 12  # the stored sample is not touched
    items = [
        stored(mixed, 1),
        stored(seg("b", 0, versions=("0",)), 2),
        stored(seg("c", 0, versions=("default",)), 3),
    ]
    rollouts, stats = to_rollouts(items, AcceptancePolicy(), current_version=3, max_staleness=1)
    assert [(r.rollout_id, r.trainable_tokens) for r in rollouts] == [("a", 8)]
    assert stats.rollouts_dropped == {"stale": 2} and stats.stale_tokens_masked == 12
    unfiltered, _ = to_rollouts(items, AcceptancePolicy())
    assert len(unfiltered) == 3
    fresh = dataclasses.replace(mixed, weight_versions=[VersionSpan("weight_v000003", 0, 12)])
    assert mask_stale_tokens(fresh, 3, 0)[1] == 0
