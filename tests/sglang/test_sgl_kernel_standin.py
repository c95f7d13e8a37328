"""rlgw's stand-in for the two sgl-kernel CPU ops SGLang calls, against what SGLang expects of them.

The expected results are written the way SGLang's own Triton kernels compute them
(`sglang/srt/mem_cache/allocation.py:assign_req_to_token_pool`: request i's slots start at the sum of
the earlier requests' lengths; `sglang/kernels/ops/kvcache/cache_move.py:copy_all_layer_kv_cache_tiled`:
every source row is loaded before any target row is stored), on real KV-shaped buffers.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType

import pytest
import torch

from tests.support.sglang_env import STANDIN


@pytest.fixture(scope="module")
def standin() -> ModuleType:
    path = STANDIN / "sgl_kernel" / "__init__.py"
    spec = importlib.util.spec_from_file_location("sgl_kernel_standin", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_assign_req_to_token_pool_writes_each_requests_slots_in_order(standin: ModuleType) -> None:
    gen = torch.Generator().manual_seed(0)
    pool_len = 32
    req_to_token = torch.zeros((6, pool_len), dtype=torch.int32)
    req_pool_indices = torch.tensor([4, 1, 3])
    start = torch.tensor([0, 7, 30])
    end = torch.tensor([5, 19, 31])  # 5, 12 and 1 new tokens
    out_cache_loc = torch.randperm(1000, generator=gen)[: int((end - start).sum())]
    expected = req_to_token.clone()
    offsets = torch.cumsum(end - start, 0) - (end - start)  # the Triton kernel's out_offset
    for pid in range(3):
        n = int(end[pid] - start[pid])
        got = out_cache_loc[int(offsets[pid]) : int(offsets[pid]) + n]
        expected[int(req_pool_indices[pid]), int(start[pid]) : int(end[pid])] = got.to(torch.int32)

    standin.assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start, end, out_cache_loc, pool_len)

    assert torch.equal(req_to_token, expected)
    assert int((req_to_token != 0).sum()) == out_cache_loc.numel() - int((out_cache_loc == 0).sum())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copy_all_layer_kv_cache_moves_rows_in_every_buffer(standin: ModuleType, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    # Two layers' K and V buffers: [slots, heads, head_dim], as SGLang's MHA token pool lays them out.
    buffers = [torch.randn((40, 2, 16), generator=gen).to(dtype) for _ in range(4)]
    before = [b.clone() for b in buffers]
    data_ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)
    strides = torch.tensor([b[0].numel() * b.element_size() for b in buffers], dtype=torch.int64)
    # A swap (rows 3 and 9) and a chain (11 -> 12 while 12 -> 13): sources are read before writes.
    tgt = torch.tensor([3, 9, 12, 13, 20], dtype=torch.int64)
    src = torch.tensor([9, 3, 11, 12, 39], dtype=torch.int64)

    standin.copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt, src)

    for got, old in zip(buffers, before, strict=True):
        expected = old.clone()
        expected[tgt] = old[src]
        assert torch.equal(got, expected)


def test_the_speculative_names_refuse_clearly(standin: ModuleType) -> None:
    for name in (
        "build_tree_kernel_efficient_cpu",
        "verify_tree_greedy_cpu",
        "fill_accept_out_cache_loc_cpu",
        "fill_bonus_tokens_cpu",
        "rotate_input_ids_cpu",
        "assign_draft_cache_locs_contiguous_cpu",
        "assign_extend_cache_locs_cpu",
    ):
        with pytest.raises(NotImplementedError, match="stand-in"):
            getattr(standin, name)()
