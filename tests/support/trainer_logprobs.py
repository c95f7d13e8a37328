"""Trainer logprobs against an engine's, through a real gateway, for any engine's `Stack`.

`tests/trainer/test_engine_logprobs.py` runs it on the embedded engine; the real-SGLang and vLLM
tiers pass their own `Stack` (tests/support/e2e.py) serving a copy of `padded_perturbed_model`: a
model whose padded vocabulary rows are far from zero, so a trainer that normalizes over another
vocabulary than the engine's, or scales by another temperature, shows a gap well above 1e-3.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from rlgw.gateway.trajectories.client import GatewayClient, StoredTrajectory
from rlgw.trainer.batch import build_step
from rlgw.trainer.consumer import AcceptancePolicy, TrajectoryConsumer, to_rollouts
from rlgw.trainer.rollouts import ChatRollouts, WordTask
from tests.support.procs import FIXTURES

TEMPERATURES = (0.7, 1.0)


def padded_perturbed_model(
    dst: Path, src: Path = FIXTURES / "tiny-qwen3", tokenizer_vocab: int = 4026, padded_scale: float = 0.2
) -> Path:
    """A copy of `src` (a tiny Qwen3 with a padded vocabulary, tied embeddings) with every weight plus
    N(0, 0.03) noise and its padded embedding rows (ids `tokenizer_vocab`.., hence also output rows)
    set to N(0, `padded_scale`): rows that carry mass in a log_softmax over the whole vocabulary.

    At 0.2 the padded ids hold 0.8% of the next-token mass on average over one word-task reply at
    T=1 (4% at most), and a trainer normalizing over the tokenizer's vocabulary is off by up to 0.67
    (T=1) and 3.4 (T=0.7) over a step; an engine that samples them (SGLang) picks one now and then
    (its sample is rejected at finish, bad_token). At 0.5 they hold 70% and SGLang would sample
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
    trainer: Any, items: list[StoredTrajectory], vocabulary: str | None = None
) -> dict[str, float]:
    """One step's receipt metrics (`logprob_gap_max`: max |trainer - engine|, `ratio_mean`) of
    `trainer` on the recorded `items` at the served weights (lr 0: nothing moves). `vocabulary`
    replaces the samples' own, to measure what a trainer normalizing over another one would see."""
    rollouts, _ = to_rollouts(items, AcceptancePolicy())
    assert sum(r.trainable_tokens for r in rollouts) >= 16
    step = build_step(rollouts, micro_batch_rows=3)
    if vocabulary is not None:
        step.micro_batches = [dataclasses.replace(mb, vocabulary=vocabulary) for mb in step.micro_batches]
    return trainer.loss_and_backward(step)
