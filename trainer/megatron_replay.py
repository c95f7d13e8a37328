"""Rollout routing replay (R3) in megatron-core's MoE layers: each token goes to the experts the
engine routed it to (the micro-batch's `routed_experts`, from the samples' `rollout_routed_experts`).

megatron-core routes through a `RouterReplay` per MoE layer when `moe_enable_routing_replay` is set;
its top-k goes through `get_replay_topk(scores, topk, ...)`. Each of this rank's routers gets ours:
the router's own top-k, replaced by the recorded ids wherever a token has them (padding and a
segment's last token keep their own), and the scores taken at those ids, so megatron-core's
softmax after them (`moe_router_pre_softmax=False`, HF's `norm_topk_prob`) or the softmax over all
experts before them (pre-softmax) gives the weights HF's router would over the same experts. The
router runs on this rank's own tokens before they are dispatched to other expert-parallel ranks,
in megatron's [tokens, rows] order; each rank's stage holds its own layers (global `layer_number`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor


class MegatronRoutingReplay:
    """The replay of one rank's piece of a `GPTModel`; `table` is read by every forward while set."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.table: Tensor | None = None  # int32 [rows, tokens, layers, top_k]; -1: not recorded
        self.routers = 0
        for layer in module.decoder.layers:
            replay = getattr(getattr(getattr(layer, "mlp", None), "router", None), "router_replay", None)
            if replay is not None:
                replay.get_replay_topk = functools.partial(self._topk, layer.layer_number - 1)
                self.routers += 1

    def _topk(
        self,
        layer: int,
        scores: Tensor,
        topk: int,
        num_groups: int | None = None,
        group_topk: int | None = None,
        default_compute_topk: Callable[..., tuple[Tensor, Tensor]] | None = None,
    ) -> tuple[Tensor, Tensor]:
        assert default_compute_topk is not None
        values, own = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
        if self.table is None:
            return values, own
        # [rows, tokens] -> megatron's token order, sequence-major ([tokens, rows] flattened).
        recorded = self.table[:, :, layer].transpose(0, 1).reshape(-1, topk).to(scores.device, torch.long)
        index = torch.where((recorded >= 0).all(dim=-1, keepdim=True), recorded, own)
        return scores.gather(1, index), index
