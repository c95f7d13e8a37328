"""`rlgw train` with the Megatron trainer split over ranks: `--nproc-per-node N` re-execs under torchrun.

The real run (slow, about 1.5 min): word-tiny-megatron.json (tp=2, 12 iterations) on two processes:
rank 0 runs the gateway, the engine and the loop, both ranks train, the gathered weights are
published as xor deltas and served each iteration, the trainer's logprobs at tp=2 are the engine's
(gap at most 1e-3, IS ratio 1 within 1e-3), and the word is learnt (first iteration's mean reward
below 0.2, last two above 0.8; here it is 1.0 from the third iteration on). The same at dp=2 with
megatron-core's distributed optimizer (long tier, 47 s here: its step is held to AdamW's in
test_megatron_ranks.py; here the loop learns with it, 1.0 from the third iteration).
The quick ones: a process count that does not fit the split, and a split or the distributed
optimizer without Megatron, are refused.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from rlgw.trainer.config import TrainConfig
from tests.support.procs import REPO
from tests.trainer.test_loop_learns import check_versions_and_sessions

CONFIG = REPO / "trainer" / "configs" / "word-tiny-megatron.json"


def train(config: Path, work: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlgw.bin.main", "--log-level", "warning", "train", "--config", str(config),
         "--work-dir", str(work), "--no-progress", *extra],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core is not installed")
@pytest.mark.parametrize(
    "parallel",
    [
        pytest.param({"tp": 2, "pp": 1, "dp": 1}, id="tp2"),
        pytest.param({"tp": 1, "pp": 1, "dp": 2, "distributed_optimizer": True}, id="dp2-distopt",
                     marks=pytest.mark.long),
    ],
)  # fmt: skip
def test_rlgw_train_learns_with_megatron_on_two_processes(parallel: dict, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(json.loads(CONFIG.read_text()) | {"parallel": parallel}))
    work = tmp_path / "work"
    proc = train(config, work, "--nproc-per-node", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    receipts = [json.loads(line) for line in (work / "receipts.jsonl").read_text().splitlines()]
    check_versions_and_sessions(receipts, json.loads(CONFIG.read_text())["iterations"])
    assert receipts[0]["losses"]["logprob_gap_max"] <= 1e-3
    rewards = [r["reward_mean"] for r in receipts]
    assert rewards[0] < 0.2, rewards
    assert sum(rewards[-2:]) / 2 > 0.8, rewards


def test_a_process_count_that_does_not_fit_the_split_is_refused(tmp_path: Path) -> None:
    proc = train(CONFIG, tmp_path, "--nproc-per-node", "3")
    assert proc.returncode == 2
    assert "--nproc-per-node 3" in proc.stderr and "tp * pp * dp = 2" in proc.stderr


def test_a_split_needs_the_megatron_trainer(tmp_path: Path) -> None:
    cfg = json.loads(CONFIG.read_text()) | {"trainer": "torch"}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    proc = train(path, tmp_path)
    assert proc.returncode == 2 and "needs trainer: megatron" in proc.stderr


def test_the_distributed_optimizer_is_a_megatron_option() -> None:
    doc = json.loads(CONFIG.read_text())
    assert TrainConfig.model_validate(doc).parallel.distributed_optimizer is False
    doc["parallel"]["distributed_optimizer"] = True
    assert TrainConfig.model_validate(doc).parallel.distributed_optimizer is True
    with pytest.raises(ValidationError, match="needs trainer: megatron"):
        TrainConfig.model_validate(doc | {"trainer": "torch", "parallel": {"distributed_optimizer": True}})
