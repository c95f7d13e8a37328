"""Rollouts of a MoE model on the embedded engine with their routed experts, as samples, and the
trainer's view of them with and without routing replay: the logprob gap and the routing mismatch.
Shared by `tests/trainer/test_routing_replay.py` and `bench/moe_replay.py`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rlgw.gateway.sample import Sample, SampleStatus, VersionSpan, compact_routing
from tests.trainer.support import sampled_at


def engine_samples(model: Path, prompts: list[list[int]], max_new_tokens: int, seed: int = 1) -> list[Sample]:
    """One sample per prompt, sampled at temperature 1 by an in-process embedded engine, with the
    engine's logprobs and routed experts (every token's, the prompt's included)."""
    from rlgw.engine.core import Engine, EngineConfig
    from rlgw.engine.routing import routed_rows
    from tests.engine.conftest import run_requests

    engine = Engine(model, EngineConfig(max_queue=64, max_running=8))
    params = {"max_new_tokens": max_new_tokens, "temperature": 1.0, "sampling_seed": seed, "ignore_eos": True}

    async def run() -> list:
        fields = {"return_logprob": True, "return_routed_experts": True}
        return [(await run_requests(engine, p, [params], **fields))[0] for p in prompts]

    try:
        reqs = asyncio.run(run())
    finally:
        engine.shutdown()
    samples = []
    for k, r in enumerate(reqs):
        n = len(r.output_ids)
        samples.append(
            Sample(
                tokens=np.asarray(r.input_ids + r.output_ids, dtype=np.int32),
                response_length=n,
                loss_mask=np.ones(n, dtype=np.uint8),
                rollout_log_probs=np.asarray(r.output_logprobs, dtype=np.float32),
                reward=0.0,
                status=SampleStatus.COMPLETED,
                rollout_id=f"r{k}",
                group_index=0,
                weight_versions=[VersionSpan("v0", 0, n)],
                metadata=sampled_at(1.0),
                rollout_routed_experts=compact_routing(routed_rows(r).numpy()),
            )
        )
    return samples


@dataclass
class Gap:
    """The trainer against the engine over the samples' generated tokens."""

    max_gap: float  # largest |trainer logprob - engine logprob|
    mean_gap: float
    mismatch: float  # fraction of generated tokens routed to another expert set in some layer

    def row(self) -> str:
        return f"{self.max_gap:10.2e} {self.mean_gap:10.2e} {100 * self.mismatch:9.1f}%"


def trainer_gap(trainer, samples: list[Sample]) -> Gap:
    """The gap and routing mismatch of `trainer` (a `TorchTrainer`, replaying or not) on `samples`."""
    from rlgw.trainer.batch import pack_rows, step_vocabulary
    from rlgw.trainer.objective import token_log_probs

    mb = pack_rows([(s, 0.0, k) for k, s in enumerate(samples)], step_vocabulary(samples), trainer.pad_id)
    chosen: dict[int, torch.Tensor] = {}
    hooks = []
    for i, layer in enumerate(trainer.model.get_decoder().layers):
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None:  # registered after the replay hook: sees the experts actually used

            def keep(_m, _in, out, i=i) -> None:
                chosen[i] = out[2].detach().reshape(mb.rows, -1, out[2].shape[-1])

            hooks.append(gate.register_forward_hook(keep))
    try:
        with torch.no_grad():
            lp = token_log_probs(trainer.logits(mb), mb.input_ids)
    finally:
        for h in hooks:
            h.remove()
    gaps, flips = [], []
    for i, s in enumerate(samples):
        p, n = s.prompt_length, len(s.tokens)
        gaps.append((lp[i, p:n] - torch.from_numpy(s.rollout_log_probs)).abs())
        # Token t (t >= p) was sampled from position t - 1's forward: its routing decided it.
        used = torch.stack([chosen[j][i, p - 1 : n - 1] for j in sorted(chosen)], dim=1).sort(-1).values
        recorded = torch.from_numpy(s.rollout_routed_experts[p - 1 :, sorted(chosen)].astype(np.int64))
        flips.append((used.cpu() != recorded.sort(-1).values).any(-1).any(-1))
    gap = torch.cat(gaps)
    return Gap(float(gap.max()), float(gap.mean()), float(torch.cat(flips).float().mean()))
