"""Megatron-core GPTModel vs the PyTorch trainer on identical weights and batch: loss (1e-5 rel), grads.

And megatron-core's distributed optimizer (`parallel.distributed_optimizer` in the config) against
the default AdamW on one rank, over two clipped steps with weight decay (its sharding over replicas:
`test_megatron_ranks.py`).
"""

from __future__ import annotations

import importlib.util
import itertools
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from rlgw.gateway.sample import Sample, SampleStatus, VersionSpan
from rlgw.trainer.batch import Rollout, build_step
from rlgw.trainer.objective import LossConfig
from rlgw.trainer.torch_trainer import OptimConfig, TorchTrainer
from tests.support.procs import FIXTURES, REPO
from tests.trainer.support import sampled_at

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None,
    reason="megatron-core is not installed (pip install -e '.[train]')",
)
MODEL = FIXTURES / "tiny-qwen3"


def batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    rollouts = []
    for k, (prompt, response, segments) in enumerate([(9, 14, 2), (6, 8, 1), (11, 5, 1)]):
        segs = []
        tokens = rng.integers(0, 4000, prompt + response).tolist()
        mask = (rng.random(response) > 0.3).astype(np.uint8)
        mask[0] = 1
        lps = np.where(mask == 1, -rng.random(response) * 3, 0.0).astype(np.float32)
        cuts = [0, response // 2, response] if segments == 2 else [0, response]
        for a, b in itertools.pairwise(cuts):
            n = b - a
            ids = np.asarray(tokens[: prompt + b], np.int32)
            done = SampleStatus.COMPLETED
            segs.append(Sample(ids, n, mask[a:b].copy(), lps[a:b].copy(), float(k % 2), done, f"r{k}", 0,
                               [VersionSpan("0", 0, n)], sampled_at()))  # fmt: skip
            segs[-1].loss_mask[0] = 1
        rollouts.append(Rollout(f"r{k}", 0, float(k % 2), segs))
    return build_step(rollouts, micro_batch_rows=2)


def compare(device: str) -> None:
    from rlgw.trainer.megatron_trainer import MegatronTrainer

    cfg = LossConfig(clip_low=0.2, clip_high=0.28, dual_clip=3.0, entropy_coef=0.01)
    lr = 1e-3
    mt = MegatronTrainer(MODEL, cfg, OptimConfig(lr=lr), device=device)
    tt = TorchTrainer(MODEL, cfg, OptimConfig(lr=lr), device=device)
    step = batch()
    m_metrics = mt.loss_and_backward(step)
    t_metrics = tt.loss_and_backward(step)
    assert m_metrics["loss"] == pytest.approx(t_metrics["loss"], rel=1e-5)
    assert m_metrics["entropy"] == pytest.approx(t_metrics["entropy"], rel=1e-5)
    m_grads = mt.hf_gradients()
    t_grads = {n: p.grad.clone() for n, p in tt.model.named_parameters() if p.grad is not None}
    assert set(m_grads) == set(t_grads)
    for name, g in t_grads.items():
        torch.testing.assert_close(m_grads[name].cpu(), g.cpu(), rtol=1e-4, atol=1e-6, msg=name)
    # export: exactly the checkpoint's tensors, names and dtypes, before any step
    stored = load_file(str(MODEL / "model.safetensors"))
    exported = dict(mt.export_weights())
    assert set(exported) == set(stored)
    for name, t in stored.items():
        assert exported[name].dtype == t.dtype and torch.equal(exported[name], t), name
    # one step each: the updated weights still agree
    m_step, t_step = mt.train_step(step), tt.train_step(step)
    assert m_step["grad_norm"] == pytest.approx(t_step["grad_norm"], rel=1e-4)
    after_m, after_t = dict(mt.export_weights()), dict(tt.export_weights())
    # Adam's first step is lr * g / (|g| + eps): where a gradient is within a few eps (1e-8) of
    # zero, the two backends' rounding of it (about 1e-9 here) moves that element's step by up
    # to lr. Those elements are held to the step's bound, every other one to the tolerance.
    for name in stored:
        grad = t_grads.get(name)
        steady = torch.ones_like(after_t[name], dtype=torch.bool) if grad is None else grad.abs() > 1e-6
        torch.testing.assert_close(
            after_m[name][steady], after_t[name][steady], rtol=1e-4, atol=1e-6, msg=name
        )
        assert float((after_m[name].float() - after_t[name].float()).abs().max()) <= 2 * lr, name


def test_megatron_matches_pytorch_on_cpu(parallel) -> None:
    compare("cpu")


@pytest.mark.gpu
def test_megatron_matches_pytorch_on_gpu(parallel) -> None:
    compare("cuda")


def two_clipped_steps(device: str, distributed_optimizer: bool) -> tuple[list[dict[str, float]], dict]:
    """Two steps on `batch()` by the trainer `rlgw train` builds from the word task's config, at one rank."""
    from rlgw.trainer.config import TrainConfig
    from rlgw.trainer.loop import build_trainer

    doc = json.loads((REPO / "trainer/configs/word-tiny-megatron.json").read_text())
    # the norm is 0.1 then 0.44: clipped both times. Without the clip, or the weight decay, the
    # distributed optimizer's second step is another (norm, loss and weights: 7e-4, 4e-4 apart)
    optim = {"lr": 1e-3, "grad_clip": 0.05, "weight_decay": 0.1}
    doc |= {"model": str(MODEL), "device": device, "optim": optim,
            "parallel": {"distributed_optimizer": distributed_optimizer}}  # fmt: skip
    trainer = build_trainer(TrainConfig.model_validate(doc))
    assert type(trainer.optimizer).__name__ == ("ChainedOptimizer" if distributed_optimizer else "AdamW")
    metrics = [trainer.train_step(batch()) for _ in range(2)]
    return metrics, dict(trainer.export_weights())


def distributed_optimizer_steps_as_adamw(device: str) -> None:
    adamw, distopt = two_clipped_steps(device, False), two_clipped_steps(device, True)
    for a, d in zip(adamw[0], distopt[0], strict=True):
        assert d["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert d["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    for name, w in adamw[1].items():
        torch.testing.assert_close(distopt[1][name], w, rtol=0, atol=1e-5, msg=name)


def test_distributed_optimizer_steps_as_adamw_on_cpu(parallel) -> None:
    distributed_optimizer_steps_as_adamw("cpu")


@pytest.mark.gpu
def test_distributed_optimizer_steps_as_adamw_on_gpu(parallel) -> None:
    distributed_optimizer_steps_as_adamw("cuda")
