"""The ranks of a Megatron run: process groups, who each rank is, and what moves between them.

Under `torchrun` every rank joins the group torchrun describes; alone, a one-process gloo group
is formed without touching the environment. Megatron's own groups come from
`parallel_state.initialize_model_parallel` (tensor, then data, then pipeline, its order). Rank 0
drives: it runs the rollouts and the gateway, and tells the others what to do next
(`command`); a step's micro-batches are scattered by data-parallel rank (`scatter_step`; every
share keeps the whole step's per-rollout token counts, so the loss denominators are the step's);
each rank's local tensors are gathered to rank 0 for publishing (`gather_to_driver`: names and
shapes as objects, then every tensor point to point). Commands and steps move with
torch.distributed's pickling collectives (`*_object*`): they are small.
This module knows nothing about models, losses or the HF layout.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from rlgw.trainer.batch import StepBatch


@dataclass(frozen=True, slots=True)
class Layout:
    """This rank's place: global rank and world, the three sizes and its rank along each."""

    rank: int
    world: int
    tp: int
    pp: int
    dp: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    dp_of_rank: tuple[int, ...]  # every global rank's data-parallel rank (for scattering)

    @property
    def driver(self) -> bool:
        """Rank 0 runs the loop; the others follow its commands."""
        return self.rank == 0

    @property
    def first_stage(self) -> bool:
        """Holds the embedding."""
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        """Holds the final norm and the output layer, and computes the loss."""
        return self.pp_rank == self.pp - 1


def init_parallel(tp: int = 1, pp: int = 1, dp: int | None = None, backend: str | None = None) -> Layout:
    """Join (or create) the process group and Megatron's model-parallel groups; this rank's `Layout`.

    `dp` is what the world leaves (world / (tp * pp)); when given it must be that.
    """
    from megatron.core import parallel_state

    if not dist.is_initialized():
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if "RANK" in os.environ:  # under torchrun: the group it describes
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(backend)
        else:  # run alone: a one-process group, without touching the environment
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    world = dist.get_world_size()
    if world % (tp * pp) or (dp is not None and dp * tp * pp != world):
        raise ValueError(
            f"parallel tp={tp} x pp={pp} x dp={dp if dp is not None else '?'} does not fit the {world} "
            f"process(es) launched: launch tp * pp * dp processes (torchrun --nproc-per-node N)"
        )
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp
        )
    dp_rank = parallel_state.get_data_parallel_rank()
    dp_of_rank: list[Any] = [None] * world
    dist.all_gather_object(dp_of_rank, dp_rank)
    return Layout(
        rank=dist.get_rank(),
        world=world,
        tp=tp,
        pp=pp,
        dp=world // (tp * pp),
        tp_rank=parallel_state.get_tensor_model_parallel_rank(),
        pp_rank=parallel_state.get_pipeline_model_parallel_rank(),
        dp_rank=dp_rank,
        dp_of_rank=tuple(dp_of_rank),
    )


def command(layout: Layout, name: str | None = None) -> str:
    """Rank 0 sends `name` to every rank; every other rank receives it (pass nothing)."""
    if layout.world == 1:
        return name or ""
    box = [name if layout.driver else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def dp_share(step: StepBatch, dp_rank: int, dp: int) -> StepBatch:
    """Data-parallel rank `dp_rank`'s micro-batches of `step` (round robin), with the whole step's counts.

    A rank left without a micro-batch gets one whose loss mask is all zero (it adds nothing to the
    loss or the gradients), so that every replica runs its schedule and joins the gradient reduction.
    """
    mbs = step.micro_batches[dp_rank::dp]
    if not mbs:
        first = step.micro_batches[0]
        mbs = [replace(first, loss_mask=torch.zeros_like(first.loss_mask))]
    return StepBatch(micro_batches=mbs, rollout_tokens=step.rollout_tokens)


def scatter_step(layout: Layout, step: StepBatch | None) -> StepBatch:
    """Every rank's share of rank 0's `step` (others pass None); all ranks of a replica get the same."""
    if layout.world == 1:
        assert step is not None
        return step
    shares = None
    if layout.driver:
        assert step is not None
        per_dp = [dp_share(step, r, layout.dp) for r in range(layout.dp)]
        shares = [per_dp[d] for d in layout.dp_of_rank]
    box: list[Any] = [None]
    dist.scatter_object_list(box, shares, src=0)
    return box[0]


def gather_to_driver(
    layout: Layout, local: dict[str, Tensor]
) -> dict[tuple[int, int], dict[str, Tensor]] | None:
    """On rank 0, the CPU copies of `local` of every (tp_rank, pp_rank) of data-parallel replica 0.

    The names and shapes go first (small objects), then each tensor point to point to rank 0, so
    no tensor is pickled; None on the other ranks.
    """

    def copy(t: Tensor) -> Tensor:
        return t.detach().to("cpu", copy=True)

    if layout.world == 1:
        return {(0, 0): {k: copy(v) for k, v in local.items()}}
    sender = layout.dp_rank == 0
    meta = (layout.tp_rank, layout.pp_rank, [(k, tuple(v.shape), v.dtype) for k, v in local.items()])
    metas: list[Any] | None = [None] * layout.world if layout.driver else None
    dist.gather_object(meta if sender else None, metas, dst=0)
    if not layout.driver:
        for t in local.values() if sender else ():
            dist.send(t.detach().contiguous(), dst=0)
        return None
    assert metas is not None
    out = {}
    device = next(iter(local.values())).device
    for src, m in enumerate(metas):
        if m is None:
            continue
        tp_rank, pp_rank, names = m
        if src == 0:
            out[(tp_rank, pp_rank)] = {k: copy(v) for k, v in local.items()}
            continue
        piece = {}
        for name, shape, dtype in names:
            buf = torch.empty(shape, dtype=dtype, device=device)
            dist.recv(buf, src=src)
            piece[name] = buf.to("cpu")
        out[(tp_rank, pp_rank)] = piece
    return out


def all_gather(layout: Layout, local: Any) -> list[Any]:
    """`local` of every rank, on every rank."""
    if layout.world == 1:
        return [local]
    out: list[Any] = [None] * layout.world
    dist.all_gather_object(out, local)
    return out
