"""A learning run with routing replay: `rlgw train` on a MoE whose routing hangs on rounding
(`upcycled_tiny_moe`: tiny-qwen3's MLPs upcycled into 8 noisy experts behind near-tie routers), the
gateway recording each turn's routed experts from the embedded engine and the Megatron trainer
replaying them (`moe.routing_replay: true`). The word task learns (first iteration's reward under
0.2, the last two's mean over 0.8) and every iteration's trainer logprobs are the engine's (largest
gap 1e-4; without replay this model's gap reaches about 0.1, see bench/moe_replay.py). Then the same
with the experts spread over two ranks (dp=2, ep=2). Slow: real `rlgw train` processes.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.support.procs import REPO
from tests.trainer.support import run_train, upcycled_tiny_moe

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None,
        reason="megatron-core is not installed (pip install -e '.[train]')",
    ),
]


def config(tmp_path: Path, **change) -> Path:
    doc = json.loads((REPO / "trainer" / "configs" / "word-tiny.json").read_text())
    doc.update(model=str(upcycled_tiny_moe(tmp_path / "model")), trainer="megatron",
               moe={"routing_replay": True}, **change)  # fmt: skip
    (tmp_path / "moe.json").write_text(json.dumps(doc))
    return tmp_path / "moe.json"


def test_replayed_moe_learns_with_the_engines_logprobs(tmp_path: Path) -> None:
    receipts = run_train(config(tmp_path, iterations=6), tmp_path / "work")
    rewards = [r["reward_mean"] for r in receipts]
    assert rewards[0] < 0.2 and sum(rewards[-2:]) / 2 > 0.8, rewards
    assert all(r["trainable_tokens"] > 0 and r["logprob_gap_max"] <= 1e-4 for r in receipts)


def test_replay_holds_with_experts_over_two_ranks(tmp_path: Path) -> None:
    cfg = config(tmp_path, iterations=2, parallel={"dp": 2, "ep": 2})
    receipts = run_train(cfg, tmp_path / "work", "--nproc-per-node", "2")
    assert [r["published"]["served_versions"] for r in receipts] == [["1"], ["2"]]
    assert all(r["trainable_tokens"] > 0 and r["logprob_gap_max"] <= 1e-4 for r in receipts)
