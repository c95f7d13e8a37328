"""rlgw's stand-in for sgl-kernel's CPU build: NOT sgl-kernel, only the ops SGLang's CPU path imports.

sgl-kernel's CPU build is compiled from SGLang's source tree and is not on PyPI (the `sgl-kernel`
wheels there are CUDA builds), yet SGLang 0.5.23's CPU engine imports these names from `sgl_kernel`
unconditionally. Two are called on every request and are plain index and copy bookkeeping, written
here in torch with the semantics of their call sites; the seven speculative-decoding names are only
imported (SGLang calls them only with speculative decoding, which the tests never enable) and raise
if called. Everything else SGLang gates on AMX support and runs in native torch. The tests put this
directory on the SGLang server's `PYTHONPATH` (tests/support/sglang_env.py).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

__version__ = "0.0.0+rlgw-standin"


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new KV slots into its row of the request-to-token table.

    Request i takes the next `end_offset[i] - start_offset[i]` entries of `out_cache_loc` (consumed in
    order across requests) into `req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]]`.
    `pool_len` is the table's row length (the CPU kernel's stride; torch indexing knows it).
    """
    taken = 0
    rows = req_pool_indices.tolist()
    for row, start, end in zip(rows, start_offset.tolist(), end_offset.tolist(), strict=True):
        n = end - start
        req_to_token[row, start:end] = out_cache_loc[taken : taken + n].to(req_to_token.dtype)
        taken += n


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """Copy KV row `src_loc[j]` onto row `tgt_loc[j]` for each j, in every buffer.

    Each buffer is given by its base address (`data_ptrs[b]`) and its row size in bytes
    (`strides[b]`), as SGLang's `copy_all_layer_kv_cache_func` passes them. All source rows are read
    before any target row is written, as SGLang's Triton kernel does ("safe for in-place copy").
    """
    if tgt_loc.numel() == 0:
        return
    rows = int(max(int(tgt_loc.max()), int(src_loc.max()))) + 1
    tgt, src = tgt_loc.long(), src_loc.long()
    for base, row_bytes in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        memory = (ctypes.c_uint8 * (rows * row_bytes)).from_address(base)
        table = torch.frombuffer(memory, dtype=torch.uint8).view(rows, row_bytes)
        table[tgt] = table[src]  # the right side is a gathered copy


def _speculative_only(name: str) -> Callable[..., None]:
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise NotImplementedError(
            f"sgl_kernel.{name}: rlgw's sgl-kernel stand-in has no speculative-decoding ops "
            "(tests/support/sgl_kernel_standin); run SGLang without speculative decoding"
        )

    refuse.__name__ = name
    return refuse


build_tree_kernel_efficient_cpu = _speculative_only("build_tree_kernel_efficient_cpu")
verify_tree_greedy_cpu = _speculative_only("verify_tree_greedy_cpu")
fill_accept_out_cache_loc_cpu = _speculative_only("fill_accept_out_cache_loc_cpu")
fill_bonus_tokens_cpu = _speculative_only("fill_bonus_tokens_cpu")
rotate_input_ids_cpu = _speculative_only("rotate_input_ids_cpu")
assign_draft_cache_locs_contiguous_cpu = _speculative_only("assign_draft_cache_locs_contiguous_cpu")
assign_extend_cache_locs_cpu = _speculative_only("assign_extend_cache_locs_cpu")
