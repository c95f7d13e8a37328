"""Routing replay (R3) closes the trainer/engine logprob gap a MoE's near-tie routing opens.

On `near_tie_qwen3_moe` (router pairs 1e-6 apart, top-3 of 8) the embedded engine's cached forward
and the trainer's whole-sequence forward, both fp32, send some tokens through different experts:
without replay the trainer's logprobs miss the engine's by far more than rounding; with
`routing_replay` every token takes its recorded experts and the logprobs agree to 1e-5. A dense
model with replay on is refused; a row without routing keeps the router's own choice.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from rlgw.trainer.batch import pack_rows, step_vocabulary
from rlgw.trainer.objective import LossConfig
from rlgw.trainer.settings import OptimConfig
from rlgw.trainer.torch_trainer import TorchTrainer
from tests.support.moe_replay import engine_samples, trainer_gap
from tests.support.procs import FIXTURES
from tests.trainer.support import near_tie_qwen3_moe


@pytest.fixture(scope="module")
def near_tie(tmp_path_factory) -> tuple[Path, list]:
    model = near_tie_qwen3_moe(tmp_path_factory.mktemp("near-tie"), tie=1e-6)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, 4000, 10).tolist() for _ in range(6)]
    return model, engine_samples(model, prompts, max_new_tokens=16)


def trainer(model: Path, replay: bool) -> TorchTrainer:
    return TorchTrainer(model, LossConfig(), OptimConfig(lr=1e-3), routing_replay=replay)


def test_replay_makes_trainer_logprobs_the_engines(near_tie: tuple[Path, list]) -> None:
    model, samples = near_tie
    free = trainer_gap(trainer(model, False), samples)
    replayed = trainer_gap(trainer(model, True), samples)
    assert free.mismatch > 0.02 and free.max_gap > 1e-2  # the near ties do flip
    assert replayed.mismatch == 0.0
    assert replayed.max_gap <= 1e-5


def test_a_row_without_routing_keeps_the_routers_choice(near_tie: tuple[Path, list]) -> None:
    model, samples = near_tie
    bare = dataclasses.replace(samples[0], rollout_routed_experts=None)
    mb = pack_rows([(bare, 0.0, 0)], step_vocabulary([bare]))
    with torch.no_grad():
        assert torch.equal(trainer(model, True).logits(mb), trainer(model, False).logits(mb))


def test_replay_on_a_dense_model_is_refused() -> None:
    with pytest.raises(ValueError, match="no MoE router"):
        TorchTrainer(FIXTURES / "tiny-qwen3", LossConfig(), OptimConfig(), routing_replay=True)
