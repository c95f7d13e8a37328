"""A training run's seed fixes what its rollouts sample: each attempt's session gets its own seed, and the
gateway seeds each turn from that, so a rerun samples the same tokens and no two attempts share a stream.

Real parts: `rlgw engine` on tiny-qwen3 behind `rlgw serve` (`tests/support/e2e.py`), `ChatRollouts`
(the `openai` SDK, one session per attempt) at temperature 1, sessions running concurrently.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rlgw.trainer.rollouts import ChatRollouts, WordTask
from tests.support.e2e import Stack, stack, stored

pytestmark = pytest.mark.slow


def sampled(st: Stack, seed: int, iteration: int = 0) -> dict[str, list[int]]:
    """The sampled ids of every attempt of one iteration, by rollout id."""
    task = WordTask("Answer with one word: It", "It")
    rollouts = ChatRollouts([task], groups=2, group_size=8, max_tokens=6, concurrency=8, seed=seed)
    result = asyncio.run(rollouts.collect(st.gateway, None, iteration))
    assert result.failed_runs == 0 and len(result.cursors) == 16
    out = {}
    for cursor in result.cursors:
        doc = stored(st, cursor)
        out[doc["rollout_id"]] = doc["tokens"][len(doc["tokens"]) - doc["response_length"] :]
    return out


def test_a_seeded_run_samples_the_same_tokens_again(tiny_qwen3: Path, tmp_path: Path) -> None:
    # A store keeps each rollout id once: the rerun gets a gateway (and engine) of its own.
    with stack(tiny_qwen3, tmp_path / "first") as st:
        first = sampled(st, 0)
    with stack(tiny_qwen3, tmp_path / "again") as st:
        again, other = sampled(st, 0), sampled(st, 1, iteration=1)
    assert first == again
    assert sorted(first.values()) != sorted(other.values())
    # Attempts of one group share the prompt, not the random stream: at temperature 1 they differ.
    assert len({tuple(v) for v in first.values()}) > 8
