"""Receipts to the console line, TensorBoard event files and an offline W&B run (real libraries)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rlgw.trainer.tracking import Trackers, WandbSettings, scalars, summary_line
from tests.trainer.support import tensorboard_scalars


def receipt(it: int, *, kl: float | None = None) -> dict:
    losses = {"pg_loss": -0.01 * it, "clipfrac": 0.25, "ratio_mean": 1.0, "grad_norm": 2.0 + it}
    if kl is not None:
        losses["kl"] = kl
    return {
        "iteration": it, "reward_mean": 0.25 * it, "reward_std": 0.5, "rollouts": 32, "samples": 33,
        "trainable_tokens": 96 + it, "failed_runs": 0, "max_staleness": 0, "stale_tokens_masked": 0,
        "logprob_gap_max": 3e-6, "is_ratio_mean": 1.0, "losses": losses,
        "published": {"version": it + 1, "served_versions": [str(it + 1)]},
        "seconds": {"rollout": 2.4, "train": 0.1, "sync": 0.2, "total": 2.7},
    }  # fmt: skip


def test_one_console_line_says_reward_tokens_losses_served_version_and_time_split() -> None:
    line = summary_line(receipt(1, kl=0.0123))
    assert "\n" not in line
    for part in ("it   1", "reward 0.250±0.500", "tokens 97", "pg -0.0100", "kl 0.0123", "clip 0.25",
                 "ratio 1.0000", "gap 3.0e-06", "grad 3.000", "served v2",
                 "time rollout 2.4s train 0.1s sync 0.2s"):  # fmt: skip
        assert part in line, (part, line)
    assert "kl" not in summary_line(receipt(1))  # no KL term, no KL figure
    assert "NOT REPEATABLE" not in line


def test_the_console_line_says_when_the_engine_ignores_seeds() -> None:
    r = {**receipt(1), "not_repeatable": "SGLang 0.5.23 applies sampling_seed only when ..."}
    assert summary_line(r).endswith("  NOT REPEATABLE: the engine ignores sampling seeds")


def test_receipts_reach_tensorboard_event_files(tmp_path: Path) -> None:
    trackers = Trackers(tmp_path, tensorboard=True, wandb=None, config={})
    for it in range(3):
        trackers.log(receipt(it))
    trackers.close()
    got = tensorboard_scalars(tmp_path / "tensorboard")
    assert set(got) == set(scalars(receipt(0)))
    assert got["reward/mean"] == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert got["time/rollout_s"] == [(i, pytest.approx(2.4)) for i in range(3)]
    assert got["engine/is_ratio_mean"] == [(i, 1.0) for i in range(3)]


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed")
def test_receipts_reach_an_offline_wandb_run(tmp_path: Path) -> None:
    trackers = Trackers(
        tmp_path, tensorboard=False, wandb=WandbSettings("rlgw-test", "t"), config={"seed": 3}
    )
    for it in range(2):
        trackers.log(receipt(it))
    trackers.close()
    (run,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    data = run.read_bytes()  # wandb 0.31 ships no reader for its records; the keys are in them verbatim
    assert b"reward/mean" in data and b"engine/logprob_gap_max" in data and b"rlgw-test" in data
    assert not (tmp_path / "tensorboard").exists()
