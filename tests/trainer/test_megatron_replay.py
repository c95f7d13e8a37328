"""Routing replay in the Megatron trainer's MoE layers (megatron-core's `RouterReplay`), on the
near-tie MoE whose routing the engine's and the trainer's numerics decide differently: without replay
megatron-core's routers send some tokens elsewhere than the engine did, with it its logprobs are the
engine's to 1e-5. The expert-parallel split (dp=2, ep=2) runs in the slow learning run
(`test_moe_learning_run.py`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from rlgw.trainer.batch import pack_rows, step_vocabulary
from rlgw.trainer.objective import LossConfig
from rlgw.trainer.settings import OptimConfig
from tests.support.moe_replay import engine_samples
from tests.trainer.support import near_tie_qwen3_moe

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None,
    reason="megatron-core is not installed (pip install -e '.[train]')",
)


def megatron_gap(model: Path, samples: list, replay: bool) -> float:
    from rlgw.trainer.megatron_trainer import MegatronTrainer

    mt = MegatronTrainer(
        model, LossConfig(old_log_probs="recompute"), OptimConfig(lr=1e-3), routing_replay=replay
    )
    mb = pack_rows([(s, 0.0, k) for k, s in enumerate(samples)], step_vocabulary(samples))
    (lp,) = mt._old_log_probs([mb])
    gaps = [
        (lp[i, s.prompt_length : len(s.tokens)].cpu() - torch.from_numpy(s.rollout_log_probs)).abs().max()
        for i, s in enumerate(samples)
    ]
    return float(max(gaps))


def test_megatron_replay_makes_its_logprobs_the_engines(parallel, tmp_path: Path) -> None:
    model = near_tie_qwen3_moe(tmp_path / "model", tie=1e-7)
    rng = np.random.default_rng(0)
    samples = engine_samples(model, [rng.integers(10, 4000, 10).tolist() for _ in range(4)], 16)
    assert megatron_gap(model, samples, replay=True) <= 1e-5
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()
    assert megatron_gap(model, samples, replay=False) > 1e-2
