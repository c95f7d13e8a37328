"""The PyTorch trainer on the tiny Qwen3 fixture; dumps and `rlgw train --replay` (JSON lines, no gateway)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from rlgw.gateway.engine_semantics import PADDED
from rlgw.gateway.sample import Sample, SampleStatus, VersionSpan
from rlgw.gateway.trajectories.client import StoredTrajectory
from rlgw.trainer.batch import Rollout, build_step
from rlgw.trainer.loop import _dump, load_dump
from rlgw.trainer.objective import LossConfig, engine_logits, token_log_probs
from rlgw.trainer.torch_trainer import OptimConfig, TorchTrainer
from tests.support.procs import FIXTURES, REPO
from tests.trainer.support import sampled_at, tensorboard_scalars

MODEL = FIXTURES / "tiny-qwen3"


def sample(
    tokens: list[int], prompt: int, reward: float, rollout: str, group: int, lps: list[float]
) -> Sample:
    n = len(tokens) - prompt
    return Sample(np.asarray(tokens, np.int32), n, np.ones(n, np.uint8), np.asarray(lps, np.float32), reward,
                  SampleStatus.COMPLETED, rollout, group, [VersionSpan("0", 0, n)], sampled_at())  # fmt: skip


def on_policy(trainer: TorchTrainer, tokens: list[int], prompt: int, reward: float, rollout: str) -> Sample:
    ids = torch.tensor([tokens])
    with torch.no_grad():
        logits = engine_logits(trainer.model(ids).logits, torch.ones(1), trainer.vocab_columns[PADDED])
        lp = token_log_probs(logits, ids)[0, prompt:].tolist()
    return sample(tokens, prompt, reward, rollout, 0, lp)


def test_train_step_raises_the_rewarded_answer_and_exports_the_checkpoint_tensors() -> None:
    torch.manual_seed(0)
    trainer = TorchTrainer(MODEL, LossConfig(), OptimConfig(lr=1e-2))
    prompt = [4001, 872, 198, 100, 200, 4002, 198, 4001, 77091, 198][:8]
    good, bad = [*prompt, 40, 41, 4002], [*prompt, 90, 91, 4002]
    rollouts = [
        Rollout("g", 0, 1.0, [on_policy(trainer, good, len(prompt), 1.0, "g")]),
        Rollout("b", 0, 0.0, [on_policy(trainer, bad, len(prompt), 0.0, "b")]),
    ]
    before = {n: t.clone() for n, t in trainer.export_weights()}
    lp_good = on_policy(trainer, good, len(prompt), 1.0, "g").rollout_log_probs.sum()
    metrics = trainer.train_step(build_step(rollouts, micro_batch_rows=1))
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and metrics["grad_norm"] > 0
    assert on_policy(trainer, good, len(prompt), 1.0, "g").rollout_log_probs.sum() > lp_good
    after = dict(trainer.export_weights())
    stored = load_file(str(MODEL / "model.safetensors"))
    assert set(after) == set(stored) == set(before)
    assert all(after[n].dtype == stored[n].dtype and after[n].shape == stored[n].shape for n in stored)
    assert any(not torch.equal(after[n], before[n]) for n in stored)


def test_dump_and_replay_round_trip_through_json_lines(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    items = []
    for i in range(4):
        n = 5
        s = sample(
            rng.integers(0, 4000, 12).tolist(), 12 - n, float(i % 2), f"r{i}", 0, (-rng.random(n)).tolist()
        )
        items.append(StoredTrajectory(i + 1, f"s{i}", "task", 0, 0.0, s))
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    _dump(dumps / "iteration-00000.jsonl", items)
    back = load_dump(dumps / "iteration-00000.jsonl")
    assert [t.cursor for t in back] == [1, 2, 3, 4]
    np.testing.assert_array_equal(back[2].sample.rollout_log_probs, items[2].sample.rollout_log_probs)
    cfg = json.loads((REPO / "trainer" / "configs" / "word-tiny.json").read_text())
    cfg["model"] = str(MODEL)
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "rlgw.bin.main", "train", "--config", str(tmp_path / "cfg.json"), "--work-dir",
         str(tmp_path / "work"), "--replay", str(dumps), "--no-progress"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (receipt,) = [json.loads(x) for x in (tmp_path / "work" / "receipts.jsonl").read_text().splitlines()]
    assert receipt["rollouts"] == 4 and receipt["reward_mean"] == 0.5 and receipt["published"] is None
    assert receipt["losses"]["grad_norm"] > 0 and receipt["trainable_tokens"] == 20
    (line,) = proc.stdout.splitlines()[:-1]  # one line per iteration, then where the receipts are
    assert line.startswith("it   0  reward 0.500") and "tokens 20" in line and "ratio " in line
    scalars = tensorboard_scalars(tmp_path / "work" / "tensorboard")
    assert scalars["reward/mean"] == [(0, 0.5)] and scalars["data/trainable_tokens"] == [(0, 20.0)]


def test_a_bad_config_is_refused_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "cfg.json").write_text(json.dumps({"model": "x", "rollouts": {"kind": "chat", "tasks": []}}))
    proc = subprocess.run(
        [sys.executable, "-m", "rlgw.bin.main", "train", "--config", str(tmp_path / "cfg.json")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "rollouts.chat.tasks" in proc.stderr
