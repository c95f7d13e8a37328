"""Megatron's Qwen3-MoE equals Hugging Face's: the same experts per token, the same logprobs (1e-5).

A tiny random Qwen3-MoE (built in the test's tmp dir) runs its forward through the Megatron
trainer's own schedule (the recomputed old logprobs of the probe's synthetic step) and through
`transformers`; with `norm_topk_prob` (Megatron's softmax over the top-k logits) and a dense
second layer (`mlp_only_layers`), and without it (the softmax over all experts, pre-top-k) and
every layer MoE. The splits megatron-core cannot take are refused with reasons. The
expert-parallel step itself is in `test_megatron_ranks.py`. Slow: `rlgw train --nproc-per-node 2`
with `parallel: {"dp": 2, "ep": 2}` on the MoE model as a user runs it (the embedded engine serves
it, each iteration publishes and the engine serves the next version).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlgw.gateway.engine_semantics import PADDED
from rlgw.trainer.config import ParallelSpec
from rlgw.trainer.megatron_probe import synthetic_step
from rlgw.trainer.objective import LossConfig, engine_logits, token_log_probs
from rlgw.trainer.torch_trainer import OptimConfig
from tests.support.procs import REPO
from tests.trainer.support import run_train, tiny_qwen3_moe

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None,
    reason="megatron-core is not installed (pip install -e '.[train]')",
)


def moe_model(out: Path, norm_topk_prob: bool, mlp_only_layers: tuple[int, ...] = ()) -> Path:
    model = tiny_qwen3_moe(out, mlp_only_layers=mlp_only_layers)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "norm_topk_prob": norm_topk_prob}))
    return model


def compare(model: Path, device: str) -> float:
    """The largest gap between Megatron's and HF's logprobs of the probe's step; checks the export too."""
    from transformers import AutoModelForCausalLM

    from rlgw.trainer.megatron_trainer import MegatronTrainer

    mt = MegatronTrainer(model, LossConfig(old_log_probs="recompute"), OptimConfig(lr=1e-3), device=device)
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).to(device)
    step = synthetic_step(mt.hf["vocab_size"])
    gap = 0.0
    for mb, megatron in zip(step.micro_batches, mt._old_log_probs(step.micro_batches), strict=True):
        ids, temperature = mb.input_ids.to(device), mb.temperature.to(device)
        with torch.no_grad():
            logits = engine_logits(hf(ids).logits, temperature, mt.vocab_columns[PADDED])
        gap = max(gap, float((token_log_probs(logits, ids) - megatron).abs().max()))
    stored = load_file(str(model / "model.safetensors"))
    exported = dict(mt.export_weights())
    assert set(exported) == set(stored)
    for name, t in stored.items():
        assert torch.equal(exported[name].cpu(), t), name
    return gap


@pytest.mark.parametrize(
    ("norm_topk_prob", "mlp_only_layers"),
    [(True, (1,)), (False, ())],
    ids=["topk-renormalised-dense-layer", "softmax-over-all"],
)
def test_moe_logprobs_equal_hf_on_cpu(
    parallel, tmp_path: Path, norm_topk_prob: bool, mlp_only_layers: tuple[int, ...]
) -> None:
    assert compare(moe_model(tmp_path, norm_topk_prob, mlp_only_layers), "cpu") <= 1e-5


@pytest.mark.gpu
def test_moe_logprobs_equal_hf_on_gpu(parallel, tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    assert compare(moe_model(tmp_path, True), "cuda") <= 1e-5


def test_expert_parallel_must_divide_the_data_parallel_ranks(parallel) -> None:
    from rlgw.trainer.megatron_ranks import init_parallel

    with pytest.raises(ValueError, match=r"ep=2 does not divide the data-parallel size 1"):
        init_parallel(1, 1, ep=2)
    with pytest.raises(ValueError, match=r"ep=2 must divide dp=3"):
        ParallelSpec(dp=3, ep=2)
    assert ParallelSpec(dp=4, ep=2).world == 4  # expert parallelism adds no processes


def test_moe_splits_megatron_core_cannot_take_are_refused() -> None:
    from rlgw.trainer.megatron_trainer import moe_config

    hf = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "num_hidden_layers": 2}
    with pytest.raises(ValueError, match=r"tp=2 with a MoE model: .* sequence parallelism"):
        moe_config(hf, tp=2, cpu=False)
    with pytest.raises(ValueError, match=r"pp=2 with a MoE model needs a GPU"):
        moe_config(hf, pp=2, cpu=True)
    assert moe_config(hf, pp=2, cpu=False)["moe_token_dispatcher_type"] == "alltoall"
    assert moe_config(hf, cpu=True)["moe_token_dispatcher_type"] == "allgather"


def test_expert_parallel_shares_are_even() -> None:
    """Every rank of an expert-parallel group gets as many micro-batches, of one shape, and no new
    trainable token (the ranks exchange tokens in every MoE layer of every micro-batch)."""
    from rlgw.trainer.megatron_ranks import dp_share

    step = synthetic_step(4096)
    shapes = {tuple(mb.input_ids.shape) for mb in step.micro_batches}
    assert len(shapes) > 1 and len(step.micro_batches) % 3  # uneven over 3 ranks to begin with
    shares = [dp_share(step, r, 3, even=True) for r in range(3)]
    assert len({len(s.micro_batches) for s in shares}) == 1
    assert len({tuple(mb.input_ids.shape) for s in shares for mb in s.micro_batches}) == 1
    trainable = sum(float(mb.loss_mask.sum()) for s in shares for mb in s.micro_batches)
    assert trainable == sum(float(mb.loss_mask.sum()) for mb in step.micro_batches)


@pytest.mark.slow
def test_rlgw_train_runs_a_moe_model_with_expert_parallelism(tmp_path: Path) -> None:
    config = json.loads((REPO / "trainer" / "configs" / "word-tiny.json").read_text())
    config.update(model=str(tiny_qwen3_moe(tmp_path / "model")), trainer="megatron", iterations=3,
                  parallel={"dp": 2, "ep": 2})  # fmt: skip
    (tmp_path / "moe.json").write_text(json.dumps(config))
    receipts = run_train(tmp_path / "moe.json", tmp_path / "work", "--nproc-per-node", "2")
    assert [r["published"]["served_versions"] for r in receipts] == [["1"], ["2"], ["3"]]
    for r in receipts:  # the engine's sampled logprobs are the Megatron MoE's, experts spread over 2 ranks
        assert r["trainable_tokens"] > 0 and r["logprob_gap_max"] <= 1e-3
        assert r["is_ratio_mean"] == pytest.approx(1.0, abs=1e-3)
