"""Torch tensors <-> raw bytes (`NamedBytes`) without copies where the memory allows it.

The only place in `rlgw.sync` that maps torch dtypes to safetensors dtype names. Tensors on an
accelerator are copied to the host once; CPU-contiguous tensors are viewed, never copied.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from rlgw.sync.full import NamedBytes

TORCH_TO_ST: dict[torch.dtype, str] = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
ST_TO_TORCH: dict[str, torch.dtype] = {v: k for k, v in TORCH_TO_ST.items()}


def st_dtype(dtype: torch.dtype) -> str:
    """safetensors name of a torch dtype; raises ValueError for an unsupported one."""
    try:
        return TORCH_TO_ST[dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype}") from None


def torch_dtype(name: str) -> torch.dtype:
    """torch dtype of a safetensors dtype name (also accepts `bfloat16`-style torch names)."""
    if name in ST_TO_TORCH:
        return ST_TO_TORCH[name]
    dt = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype) or dt not in TORCH_TO_ST:
        raise ValueError(f"unsupported dtype {name!r}")
    return dt


def tensor_bytes(t: torch.Tensor) -> np.ndarray:
    """The bytes of `t` as a flat uint8 numpy array (a view for CPU-contiguous tensors)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8).numpy()


def named_bytes(named: Iterable[tuple[str, torch.Tensor]]) -> list[NamedBytes]:
    """`NamedBytes` for every `(name, tensor)`."""
    return [NamedBytes(n, st_dtype(t.dtype), tuple(t.shape), tensor_bytes(t)) for n, t in named]


def from_bytes(data: memoryview | np.ndarray | bytearray, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor viewing `data` (no copy) with safetensors `dtype` and `shape`."""
    flat = (
        torch.frombuffer(data, dtype=torch.uint8)
        if len(memoryview(data))
        else torch.empty(0, dtype=torch.uint8)
    )
    return flat.view(torch_dtype(dtype)).reshape(shape)
