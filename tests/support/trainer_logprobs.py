"""Trainer logprobs against an engine's, through a real gateway, for any engine's `Stack`.

`tests/trainer/test_engine_logprobs.py` runs it on the embedded engine; the real-SGLang and vLLM
tiers pass their own `Stack` (tests/support/e2e.py) serving a copy of `padded_perturbed_model`: a
model whose padded vocabulary rows are far from zero, so a trainer that normalizes over another
vocabulary than the engine's, or scales by another temperature, shows a gap well above 1e-3.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from rlgw.gateway.engine_semantics import TOKENIZER
from rlgw.gateway.trajectories.client import GatewayClient, StoredTrajectory
from rlgw.trainer.batch import build_step, sample_temperature
from rlgw.trainer.consumer import AcceptancePolicy, TrajectoryConsumer, to_rollouts
from rlgw.trainer.objective import LossConfig
from rlgw.trainer.rollouts import ChatRollouts, WordTask
from rlgw.trainer.torch_trainer import OptimConfig, TorchTrainer
from tests.support.procs import FIXTURES

TEMPERATURES = (0.7, 1.0)
BACKENDS = ("torch", "megatron")
TOKENIZER_VOCAB = 4026  # tiny-qwen3's tokenizer; its config.vocab_size is 4096
HAS_MEGATRON = importlib.util.find_spec("megatron") is not None and (
    importlib.util.find_spec("megatron.core") is not None
)


def padded_perturbed_model(
    dst: Path,
    src: Path = FIXTURES / "tiny-qwen3",
    tokenizer_vocab: int = TOKENIZER_VOCAB,
    padded_scale: float = 0.2,
) -> Path:
    """A copy of `src` (a tiny Qwen3 with a padded vocabulary) with every weight plus N(0, 0.03) noise
    and its padded embedding rows (ids `tokenizer_vocab`..) set to N(0, `padded_scale`), the output
    rows too (tied embeddings share them; an untied `lm_head`, as vLLM's wide-heads copy has, gets
    the same rows): rows that carry mass in a log_softmax over the whole vocabulary.

    At 0.2 the padded ids hold 0.8% of the next-token mass on average over one word-task reply at
    T=1 (4% at most), and a trainer normalizing over the tokenizer's vocabulary is off by up to 0.67
    (T=1) and 3.4 (T=0.7) over a step on the embedded engine's replies. SGLang and vLLM sample them
    (30-37 and 11 padded ids over the 16 word-task sessions; once one is in the context, more
    follow), and the gateway keeps those samples. At 0.5 they hold 70% and SGLang would sample
    little else.
    """
    shutil.copytree(src, dst)
    gen = torch.Generator().manual_seed(0)
    state = load_file(str(dst / "model.safetensors"))
    for name, t in state.items():
        state[name] = t + 0.03 * torch.randn(t.shape, generator=gen, dtype=t.dtype)
    emb = state["model.embed_tokens.weight"]
    assert emb.shape[0] > tokenizer_vocab  # the fixture pads its vocabulary
    emb[tokenizer_vocab:] = padded_scale * torch.randn(emb[tokenizer_vocab:].shape, generator=gen)
    if "lm_head.weight" in state:
        state["lm_head.weight"][tokenizer_vocab:] = emb[tokenizer_vocab:]
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


async def record_word_task(
    gateway_url: str, work: Path, temperatures: tuple[float, ...] = TEMPERATURES
) -> dict[float, list[StoredTrajectory]]:
    """Sessions of the word task recorded through the gateway at each temperature (2 groups of 4,
    up to 12 tokens a reply), read back from its store."""
    out: dict[float, list[StoredTrajectory]] = {}
    async with GatewayClient(gateway_url, None) as gw:
        consumer = TrajectoryConsumer(gw, work / "cursor")
        for i, t in enumerate(temperatures):
            task = WordTask("Answer with one word: It", "It")
            source = ChatRollouts([task], groups=2, group_size=4, max_tokens=12, temperature=t, seed=i)
            got = await source.collect(gateway_url, None, i)
            assert got.last_cursor is not None and not got.failed_runs
            out[t] = await consumer.read_through(got.last_cursor)
    return out


def step_metrics(
    trainer: Any, items: list[StoredTrajectory], vocabulary: str | None = None, min_tokens: int = 16
) -> dict[str, float]:
    """One step's receipt metrics (`logprob_gap_max`: max |trainer - engine|, `ratio_mean`) of
    `trainer` on the recorded `items` at the served weights (lr 0: nothing moves). `vocabulary`
    replaces the samples' own, to measure what a trainer normalizing over another one would see;
    the step must hold `min_tokens` trainable tokens at least."""
    rollouts, _ = to_rollouts(items, AcceptancePolicy())
    assert sum(r.trainable_tokens for r in rollouts) >= min_tokens
    step = build_step(rollouts, micro_batch_rows=3)
    if vocabulary is not None:
        step.micro_batches = [dataclasses.replace(mb, vocabulary=vocabulary) for mb in step.micro_batches]
    return trainer.loss_and_backward(step)


def make_trainer(backend: str, model: Path) -> Any:
    """A trainer (`torch` or `megatron`) on `model` that does not move it (lr 0); skips Megatron
    where megatron-core is not installed."""
    optim = OptimConfig(lr=0.0)
    if backend == "torch":
        return TorchTrainer(model, LossConfig(), optim)
    if not HAS_MEGATRON:
        pytest.skip("megatron-core is not installed (pip install -e '.[train]')")
    from rlgw.trainer.megatron_trainer import MegatronTrainer

    return MegatronTrainer(model, LossConfig(), optim)


@pytest.fixture(scope="module")
def megatron_groups() -> Iterator[None]:
    """Megatron's process groups for one module only (other tests may form their own)."""
    yield
    if HAS_MEGATRON:
        import torch.distributed as dist
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()


def padded_ids_sampled(items: list[StoredTrajectory], tokenizer_vocab: int = TOKENIZER_VOCAB) -> int:
    """How many sampled (mask-1) tokens of `items` are padded ids, past the tokenizer's vocabulary."""
    count = 0
    for item in items:
        sample = item.sample
        response = np.asarray(sample.tokens)[-sample.response_length :]
        count += int(((response >= tokenizer_vocab) & (np.asarray(sample.loss_mask) == 1)).sum())
    return count


def assert_trainer_matches_engine(
    trainer: Any, items: list[StoredTrajectory], temperature: float, label: str
) -> tuple[float, float | None]:
    """The step's logprobs equal the engine's (max gap <= 1e-3, mean IS ratio 1 within 1e-3), and the
    same step normalized over the tokenizer's vocabulary is off by more than 5e-3 (the fixture keeps
    its teeth); returns (gap over the samples' vocabulary, gap over the tokenizer's), printed too.

    The tokenizer's-vocabulary step leaves out the sessions that sampled a padded id: such a trainer
    has no logit for it (and the gateway rejected those samples before it bounded ids by the model's
    vocabulary). Where every session sampled one, there is no such step: its gap is None."""
    assert {sample_temperature(t.sample) for t in items} == {temperature}
    metrics = step_metrics(trainer, items)
    assert metrics["logprob_gap_max"] <= 1e-3, metrics
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-3), metrics
    decodable = [t for t in items if padded_ids_sampled([t]) == 0]
    before = None
    if decodable:
        before = step_metrics(trainer, decodable, vocabulary=TOKENIZER, min_tokens=1)["logprob_gap_max"]
        assert before > 5e-3, before
    after = metrics["logprob_gap_max"]
    print(
        f"{label} T={temperature}: gap, padded vocab {after:.2e} ({len(items)} samples), "
        f"tokenizer's {before if before is None else f'{before:.2e}'} ({len(decodable)} without a padded id)"
    )
    return after, before
