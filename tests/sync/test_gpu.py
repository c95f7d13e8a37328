"""GPU carriers: CUDA IPC hand-off and NCCL broadcast between real processes (skipped without CUDA)."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from rlgw.sync.broadcast import FLATTENED, WeightUpdateGroup, make_buckets, receive_bucket, send_bucket
from rlgw.sync.colocated import cuda_ipc_manifest, decode_manifest, encode_manifest, open_manifest
from rlgw.sync.tensors import tensor_bytes
from tests.support.procs import free_port

pytestmark = pytest.mark.gpu


def _ipc_receiver(manifest: str, out: mp.Queue) -> None:
    opened = open_manifest(decode_manifest(manifest))
    out.put({n: tensor_bytes(t).tobytes() for n, t in opened.named})
    opened.close()


def test_cuda_ipc_handoff_to_another_process() -> None:
    named = [("w", torch.randn(256, 128, device="cuda")), ("b", torch.randn(7, device="cuda").bfloat16())]
    named.append(("slice", named[0][1][3:9]))  # a view with a storage offset
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_ipc_receiver, args=(encode_manifest(cuda_ipc_manifest(named)), out))
    proc.start()
    got = out.get(timeout=120)
    proc.join(timeout=60)
    assert got == {n: tensor_bytes(t).tobytes() for n, t in named}


def _nccl_receiver(port: int, announcements: list[dict], out: mp.Queue) -> None:
    torch.cuda.set_device(1)
    group = WeightUpdateGroup("127.0.0.1", port, 1, 2, backend="nccl", timeout_s=120)
    got = []
    for a in announcements:
        got += receive_bucket(group, a["names"], a["dtypes"], a["shapes"], a["load_format"] == FLATTENED)
    torch.cuda.synchronize()
    out.put({n: tensor_bytes(t).tobytes() for n, t in got})
    group.destroy()


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_nccl_broadcast_between_two_gpus() -> None:
    torch.cuda.set_device(0)
    named = [(f"l{i}", torch.randn(1024, i + 1, device="cuda")) for i in range(8)]
    named.append(("emb", torch.randn(4096, 512, device="cuda").bfloat16()))
    buckets = list(make_buckets(named, bucket_bytes=64 << 10))
    port = free_port()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_nccl_receiver, args=(port, [b.announce() for b in buckets], out))
    proc.start()
    group = WeightUpdateGroup("127.0.0.1", port, 0, 2, backend="nccl", timeout_s=120)
    for b in buckets:
        send_bucket(group, b)
    torch.cuda.synchronize()
    got = out.get(timeout=120)
    proc.join(timeout=60)
    group.destroy()
    assert got == {n: tensor_bytes(t).tobytes() for n, t in named}
