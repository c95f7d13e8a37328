"""Distributed weight broadcast: a standalone process group, the bucketed sender and the receiver.

The group is built from its own `TCPStore` and a `ProcessGroupGloo` / `ProcessGroupNCCL` object, not
through `torch.distributed.init_process_group`, so neither the trainer's nor the engine's default
group is touched (a trainer with its own Megatron groups can still join). Rank 0 is the sender; each
engine joins at `rank_offset`.

Wire protocol per bucket (the sender announces first over HTTP, then broadcasts):
- a bucket of small tensors is packed into one flat uint8 buffer (`load_format="flattened_bucket"`),
  one collective for many tensors;
- a tensor at least as big as the bucket size is broadcast alone, straight from its own memory.
The receiver allocates by the announced dtype/shape and always completes the announced collectives
(so a refused bucket never hangs the sender), then validates. HTTP and engines are not this module's.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rlgw.sync.errors import TransferError
from rlgw.sync.tensors import st_dtype, torch_dtype

log = logging.getLogger(__name__)

DEFAULT_BUCKET_BYTES = 256 << 20
FLATTENED = "flattened_bucket"


class WeightUpdateGroup:
    """A process group of one sender (rank 0) and the engines, apart from any default group."""

    def __init__(
        self,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        group_name: str = "weight_update_group",
        backend: str = "gloo",
        timeout_s: float = 120.0,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world of {world_size}")
        self.rank, self.world_size, self.group_name, self.backend = rank, world_size, group_name, backend
        timeout = datetime.timedelta(seconds=timeout_s)
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        )
        try:
            store = dist.TCPStore(
                master_address,
                master_port,
                world_size,
                is_master=rank == 0,
                timeout=timeout,
                wait_for_workers=False,
            )
            self._store = dist.PrefixStore(group_name, store)
            if backend == "gloo":
                self.pg = dist.ProcessGroupGloo(self._store, rank, world_size, timeout)
            elif backend == "nccl":
                opts = dist.ProcessGroupNCCL.Options()
                opts._timeout = timeout
                self.pg = dist.ProcessGroupNCCL(self._store, rank, world_size, opts)
            else:
                raise ValueError(f"unknown backend {backend!r} (expected gloo or nccl)")
        except (RuntimeError, dist.DistError) as exc:
            raise TransferError(
                f"cannot form weight update group {group_name!r} as rank {rank}: {exc}"
            ) from exc
        self._store_master = store  # keeps the listening socket alive on rank 0
        # Byte buffers reused across buckets and syncs: fresh pages cost a fault each, and a model's
        # worth of faults per sync would dominate the transfer (see bench/sync.py).
        self._slots: list[torch.Tensor] = []
        self._next_slot = 0

    def buffer(self, nbytes: int) -> torch.Tensor:
        """The next reusable uint8 buffer of the current transfer, `nbytes` long."""
        i = self._next_slot
        self._next_slot += 1
        if i == len(self._slots):
            self._slots.append(torch.empty(nbytes, dtype=torch.uint8, device=self.device))
        elif self._slots[i].numel() < nbytes:
            self._slots[i] = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return self._slots[i][:nbytes]

    def begin_transfer(self) -> None:
        """Start handing out buffers from the first one again (the previous transfer is consumed)."""
        self._next_slot = 0

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast `tensor` from rank 0 (in place on the receivers); raises TransferError on failure."""
        try:
            self.pg.broadcast([tensor], _root0()).wait()
        except (RuntimeError, dist.DistError) as exc:
            raise TransferError(f"broadcast in group {self.group_name!r} failed: {exc}") from exc

    def destroy(self) -> None:
        """Release the group (the store closes with it)."""
        shutdown = getattr(self.pg, "shutdown", None)
        if shutdown is not None:
            try:
                shutdown()
            except RuntimeError:
                pass
        self.pg = None
        self._store = self._store_master = None
        self._slots = []


def _root0() -> dist.BroadcastOptions:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    opts.rootTensor = 0
    return opts


@dataclass(frozen=True, slots=True)
class Bucket:
    """Tensors announced and sent together; `packed` means one flat uint8 collective for all of them."""

    names: list[str]
    tensors: list[torch.Tensor]
    packed: bool

    def announce(self) -> dict:
        """The SGLang-shaped metadata of this bucket (`names`, `dtypes`, `shapes`, `load_format`)."""
        return {
            "names": self.names,
            "dtypes": [st_dtype(t.dtype) for t in self.tensors],
            "shapes": [list(t.shape) for t in self.tensors],
            "load_format": FLATTENED if self.packed else None,
        }

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)


def make_buckets(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> Iterator[Bucket]:
    """Group tensors, in order, into buckets of about `bucket_bytes`; big tensors travel alone."""
    names: list[str] = []
    tensors: list[torch.Tensor] = []
    used = 0
    for name, t in named:
        size = t.numel() * t.element_size()
        if names and (size >= bucket_bytes or used + size > bucket_bytes):
            yield Bucket(names, tensors, packed=True)
            names, tensors, used = [], [], 0
        if size >= bucket_bytes:
            yield Bucket([name], [t], packed=False)
            continue
        names.append(name)
        tensors.append(t)
        used += size
    if names:
        yield Bucket(names, tensors, packed=True)


def send_bucket(group: WeightUpdateGroup, bucket: Bucket) -> None:
    """Sender side: broadcast one bucket's bytes (packing it first if `packed`)."""
    if bucket.packed:
        group.begin_transfer()  # the sender reuses one packing buffer for every bucket
        flat = group.buffer(bucket.nbytes)
        pos = 0
        for t in bucket.tensors:
            n = t.numel() * t.element_size()
            flat[pos : pos + n].copy_(
                t.detach().contiguous().reshape(-1).view(torch.uint8), non_blocking=True
            )
            pos += n
        group.broadcast(flat)
    else:
        t = bucket.tensors[0].detach()
        group.broadcast(
            t.to(group.device).contiguous() if t.device != group.device or not t.is_contiguous() else t
        )


def receive_bucket(
    group: WeightUpdateGroup,
    names: Sequence[str],
    dtypes: Sequence[str],
    shapes: Sequence[Sequence[int]],
    packed: bool,
) -> list[tuple[str, torch.Tensor]]:
    """Receiver side: complete the collectives of one announced bucket and return its tensors.

    The tensors view the group's reusable buffers: they stay valid until `group.begin_transfer()`
    (called by the receiver once a transfer has been applied or dropped).
    """
    if not (len(names) == len(dtypes) == len(shapes)):
        raise TransferError("names, dtypes and shapes differ in length")
    try:
        specs = [
            (n, torch_dtype(d), tuple(int(x) for x in s))
            for n, d, s in zip(names, dtypes, shapes, strict=True)
        ]
    except (ValueError, TypeError) as exc:
        # Without dtypes and shapes we cannot know the byte count; the sender's collective times out.
        raise TransferError(f"unreadable bucket announcement: {exc}") from exc
    if packed:
        sizes = [torch.Size(s).numel() * torch.empty(0, dtype=d).element_size() for _, d, s in specs]
        flat = group.buffer(sum(sizes))
        group.broadcast(flat)
        out, pos = [], 0
        for (name, dtype, shape), size in zip(specs, sizes, strict=True):
            out.append((name, flat[pos : pos + size].view(dtype).reshape(shape)))
            pos += size
        return out
    if len(specs) != 1:
        raise TransferError("an unpacked bucket carries exactly one tensor")
    name, dtype, shape = specs[0]
    nbytes = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
    t = group.buffer(nbytes).view(dtype).reshape(shape)
    group.broadcast(t)
    return [(name, t)]
