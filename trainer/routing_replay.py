"""Rollout routing replay (R3) for Hugging Face MoE models: each token goes to the experts the engine
routed it to, recorded per token and layer in the sample (`rollout_routed_experts`).

Owns the hooks on the models' top-k routers (`layer.mlp.gate`, which return (logits, weights,
indices): transformers' Qwen3-MoE, Qwen2-MoE, Mixtral) and the table they read. With a table armed
(`replaying`), each router's indices become the recorded ones and its weights are recomputed over
them as the model would have: the softmax over all experts' logits at the recorded indices,
renormalized when `norm_topk_prob`, so gradients reach the router through the weights. A position
with no record (padding, a segment's last token, a row without routing) keeps the router's own
choice. A dense layer's zero rows are never read: it has no router.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from rlgw.gateway.sample import Sample


class RoutingReplay:
    """The replay hooks of one or more models with the same layers; one table armed at a time."""

    def __init__(self) -> None:
        self._table: Tensor | None = None  # int32 [rows, tokens, layers, top_k]; -1: not recorded

    def install(self, model: torch.nn.Module) -> int:
        """Hook every MoE router of `model`; returns how many (0: a dense model)."""
        layers = model.get_decoder().layers
        count = 0
        for i, layer in enumerate(layers):
            gate = getattr(getattr(layer, "mlp", None), "gate", None)
            if gate is not None and hasattr(gate, "top_k"):
                gate.register_forward_hook(self._hook(i, bool(getattr(gate, "norm_topk_prob", False))))
                count += 1
        return count

    @contextmanager
    def replaying(self, table: Tensor | None) -> Iterator[None]:
        """Route the forward passes inside by `table` ([rows, tokens, layers, top_k]; None: no replay)."""
        self._table = table
        try:
            yield
        finally:
            self._table = None

    def _hook(self, layer: int, norm_topk_prob: bool):
        def replay(_module, _inputs, out):
            if self._table is None:
                return None
            logits, _, own = out
            recorded = self._table[:, :, layer].reshape(-1, own.shape[-1]).to(own.device, torch.long)
            known = (recorded >= 0).all(dim=-1, keepdim=True)
            index = torch.where(known, recorded, own)
            probs = torch.softmax(logits, dim=-1, dtype=torch.float)
            weights = probs.gather(1, index)
            if norm_topk_prob:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            return logits, weights.to(logits.dtype), index

        return replay


def routing_table(samples: list[Sample], width: int) -> Tensor | None:
    """A micro-batch's replay table for `samples` padded to `width` tokens: each sample's
    `rollout_routed_experts` [len(tokens) - 1, layers, top_k] at its positions, -1 elsewhere (None:
    no sample has any)."""
    present = [s.rollout_routed_experts for s in samples if s.rollout_routed_experts is not None]
    if not present:
        return None
    layers, top_k = present[0].shape[1:]
    table = torch.full((len(samples), width, layers, top_k), -1, dtype=torch.int32)
    for i, s in enumerate(samples):
        routed = s.rollout_routed_experts
        if routed is not None:
            table[i, : len(routed)] = torch.from_numpy(routed.astype("int32"))
    return table
