"""Bucketed broadcast between two real processes over gloo (the engine side is a spawned process)."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from rlgw.sync.broadcast import FLATTENED, WeightUpdateGroup, make_buckets, receive_bucket, send_bucket
from rlgw.sync.errors import TransferError
from rlgw.sync.tensors import tensor_bytes
from tests.support.procs import free_port


def _receiver(port: int, announcements: list[dict], out: mp.Queue) -> None:
    torch.set_num_threads(1)
    group = WeightUpdateGroup("127.0.0.1", port, 1, 2, timeout_s=60)
    got = []
    for a in announcements:
        got += receive_bucket(group, a["names"], a["dtypes"], a["shapes"], a["load_format"] == FLATTENED)
    out.put({n: (str(t.dtype), tuple(t.shape), tensor_bytes(t).tobytes()) for n, t in got})
    group.destroy()


def test_buckets_pack_small_tensors_and_send_big_ones_alone() -> None:
    named = [
        ("a", torch.zeros(10)),
        ("b", torch.zeros(20)),
        ("big", torch.zeros(1000)),
        ("c", torch.zeros(30)),
    ]
    buckets = list(make_buckets(named, bucket_bytes=200))
    assert [(b.names, b.packed) for b in buckets] == [(["a", "b"], True), (["big"], False), (["c"], True)]
    assert buckets[0].announce() == {
        "names": ["a", "b"],
        "dtypes": ["F32", "F32"],
        "shapes": [[10], [20]],
        "load_format": FLATTENED,
    }


def test_two_process_broadcast_is_bit_exact() -> None:
    torch.manual_seed(0)
    named = [(f"layer.{i}", torch.randn(64, i + 1)) for i in range(12)]
    named += [("emb", torch.randn(512, 300).to(torch.bfloat16)), ("ids", torch.arange(7, dtype=torch.int64))]
    buckets = list(make_buckets(named, bucket_bytes=16 << 10))
    assert any(b.packed for b in buckets) and any(not b.packed for b in buckets)
    port = free_port()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_receiver, args=(port, [b.announce() for b in buckets], out))
    proc.start()
    try:
        group = WeightUpdateGroup("127.0.0.1", port, 0, 2, timeout_s=60)
        for b in buckets:
            send_bucket(group, b)
        got = out.get(timeout=60)
        group.destroy()
    finally:
        proc.join(timeout=30)
    assert set(got) == {n for n, _ in named}
    for name, t in named:
        dtype, shape, raw = got[name]
        assert (dtype, shape, raw) == (str(t.dtype), tuple(t.shape), tensor_bytes(t).tobytes()), name


def test_unreadable_announcement_is_refused_before_any_collective() -> None:
    with pytest.raises(TransferError, match="unreadable"):
        receive_bucket(None, ["x"], ["complex_float9"], [[3]], True)  # type: ignore[arg-type]
