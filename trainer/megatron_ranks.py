"""The ranks of a Megatron run: process groups, who each rank is, and what moves between them.

Under `torchrun` every rank joins the group torchrun describes; alone, a one-process gloo group
is formed without touching the environment. Megatron's own groups come from
`parallel_state.initialize_model_parallel` (tensor, then data, then pipeline, its order; for a
MoE model the expert-parallel groups are cut out of the data-parallel ranks). Rank 0
drives: it runs the rollouts and the gateway, and tells the others what to do next
(`command`); a step's micro-batches are scattered by data-parallel rank (`scatter_step`; every
share keeps the whole step's per-rollout token counts, so the loss denominators are the step's;
with expert parallelism every share has as many micro-batches, of one shape);
each rank's local tensors are gathered to rank 0 for publishing (`gather_to_driver`: names and
shapes as objects, then every tensor point to point; one copy of each tensor-, pipeline- and
expert-parallel piece). Commands and steps move with
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

from rlgw.trainer.batch import MicroBatch, StepBatch


@dataclass(frozen=True, slots=True)
class Layout:
    """This rank's place: global rank and world, the sizes and its rank along each.

    `ep` (expert parallelism) splits the data-parallel ranks: the ranks that hold the same experts
    form an expert-data-parallel group, of which `expert_dp_rank` is this rank's place.
    """

    rank: int
    world: int
    tp: int
    pp: int
    dp: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    dp_of_rank: tuple[int, ...]  # every global rank's data-parallel rank (for scattering)
    ep: int = 1
    ep_rank: int = 0
    expert_dp_rank: int = 0

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


def init_parallel(
    tp: int = 1, pp: int = 1, dp: int | None = None, backend: str | None = None, *, ep: int = 1
) -> Layout:
    """Join (or create) the process group and Megatron's model-parallel groups; this rank's `Layout`.

    `dp` is what the world leaves (world / (tp * pp)); when given it must be that. `ep` must divide
    it: megatron-core (0.16) lays the expert-parallel groups over the ranks of the data-parallel
    ones (expert tensor-parallel size tp, so world / (tp * ep * pp) expert-data-parallel replicas).
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
    if (world // (tp * pp)) % ep:
        raise ValueError(
            f"ep={ep} does not divide the data-parallel size {world // (tp * pp)} (world {world} / "
            f"(tp={tp} * pp={pp})): megatron-core takes the expert-parallel ranks from the data-parallel ones"
        )
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, expert_model_parallel_size=ep
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
        ep=ep,
        ep_rank=parallel_state.get_expert_model_parallel_rank(),
        expert_dp_rank=parallel_state.get_expert_data_parallel_rank(),
    )


def command(layout: Layout, name: str | None = None) -> str:
    """Rank 0 sends `name` to every rank; every other rank receives it (pass nothing)."""
    if layout.world == 1:
        return name or ""
    box = [name if layout.driver else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def padded(mb: MicroBatch, rows: int, length: int) -> MicroBatch:
    """`mb` grown to `rows` x `length` tokens by rows and tokens that train nothing (zero masks).

    Exact: attention is causal (tokens added after a row's own change nothing before them), and a
    MoE layer without capacity routes each token alone.
    """

    def grow(t: Tensor, value: float = 0.0) -> Tensor:
        right = (0, length - t.shape[1]) if t.dim() == 2 else ()
        return torch.nn.functional.pad(t, (*right, 0, rows - t.shape[0]), value=value)

    teacher = mb.teacher_log_probs
    return MicroBatch(
        input_ids=grow(mb.input_ids),
        attention_mask=grow(mb.attention_mask),
        loss_mask=grow(mb.loss_mask),
        rollout_log_probs=grow(mb.rollout_log_probs),
        advantages=grow(mb.advantages),
        rollout_index=grow(mb.rollout_index),
        temperature=grow(mb.temperature, 1.0),
        vocabulary=mb.vocabulary,
        teacher_log_probs=None if teacher is None else grow(teacher),
    )


def dp_share(step: StepBatch, dp_rank: int, dp: int, *, even: bool = False) -> StepBatch:
    """Data-parallel rank `dp_rank`'s micro-batches of `step` (round robin), with the whole step's counts.

    A rank left without a micro-batch gets one whose loss mask is all zero (it adds nothing to the
    loss or the gradients), so that every replica runs its schedule and joins the gradient reduction.
    `even` (expert parallelism: the ranks of an expert-parallel group exchange tokens in every MoE
    layer of every micro-batch, and megatron-core's all-gather dispatcher needs equal shapes) gives
    every rank as many micro-batches, all of the step's largest shape (`padded`).
    """
    mbs = step.micro_batches[dp_rank::dp]
    first = step.micro_batches[0]
    blank = replace(first, loss_mask=torch.zeros_like(first.loss_mask))
    if even:
        rows = max(mb.rows for mb in step.micro_batches)
        length = max(mb.input_ids.shape[1] for mb in step.micro_batches)
        mbs += [blank] * (-(-len(step.micro_batches) // dp) - len(mbs))
        mbs = [padded(mb, rows, length) for mb in mbs]
    elif not mbs:
        mbs = [blank]
    return StepBatch(micro_batches=mbs, rollout_tokens=step.rollout_tokens)


def scatter_step(layout: Layout, step: StepBatch | None) -> StepBatch:
    """Every rank's share of rank 0's `step` (others pass None); all ranks of a replica get the same."""
    if layout.world == 1:
        assert step is not None
        return step
    shares = None
    if layout.driver:
        assert step is not None
        per_dp = [dp_share(step, r, layout.dp, even=layout.ep > 1) for r in range(layout.dp)]
        shares = [per_dp[d] for d in layout.dp_of_rank]
    box: list[Any] = [None]
    dist.scatter_object_list(box, shares, src=0)
    return box[0]


def gather_to_driver(
    layout: Layout, local: dict[str, Tensor]
) -> dict[tuple[int, int, int], dict[str, Tensor]] | None:
    """On rank 0, the CPU copies of `local` of every (tp_rank, pp_rank, ep_rank) of expert-data-parallel
    replica 0 (without experts: data-parallel replica 0 and its expert-parallel peers, which repeat
    everything but their experts).

    The names and shapes go first (small objects), then each tensor point to point to rank 0, so
    no tensor is pickled; None on the other ranks.
    """

    def copy(t: Tensor) -> Tensor:
        return t.detach().to("cpu", copy=True)

    if layout.world == 1:
        return {(0, 0, 0): {k: copy(v) for k, v in local.items()}}
    sender = layout.expert_dp_rank == 0
    meta = (
        (layout.tp_rank, layout.pp_rank, layout.ep_rank),
        [(k, tuple(v.shape), v.dtype) for k, v in local.items()],
    )
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
        key, names = m
        if src == 0:
            out[key] = {k: copy(v) for k, v in local.items()}
            continue
        piece = {}
        for name, shape, dtype in names:
            buf = torch.empty(shape, dtype=dtype, device=device)
            dist.recv(buf, src=src)
            piece[name] = buf.to("cpu")
        out[key] = piece
    return out


def all_gather(layout: Layout, local: Any) -> list[Any]:
    """`local` of every rank, on every rank."""
    if layout.world == 1:
        return [local]
    out: list[Any] = [None] * layout.world
    dist.all_gather_object(out, local)
    return out
