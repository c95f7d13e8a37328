"""What megatron-core needs to run on a CPU (gloo): shims for the places it assumes a CUDA device.

megatron-core 0.16 is written for GPUs; on a CPU (the tests, CI, a laptop) these spots fail:
- the RNG tracker forks CUDA RNG state (a no-op tracker instead);
- its global memory buffer allocates on `torch.cuda.current_device()`;
- RoPE's `get_emb` moves its frequencies to `torch.cuda.current_device()`;
- the MoE router's gating tests `te_general_gemm`, a name only bound when Transformer Engine is
  installed (`NameError: name 'te_general_gemm' is not defined`, moe_utils.py, in
  `RouterGatingLinearFunction.forward`): bound to None, its own "no TE" branch;
- `DistributedDataParallel`'s gradient buffers and the pipeline's shape exchange allocate on
  `torch.cuda.current_device()`, the p2p code calls `torch.cuda.synchronize()`, the schedules put
  their token counter on `device="cuda"`, and with tied embeddings and pp > 1 the last stage moves
  its copy of the embedding with `.cuda()`;
- the distributed optimizer accepts only parameters whose `.type()` is "torch.cuda.FloatTensor"
  (or Half/BFloat16), asserts the same of the gradients it clips, and makes its overflow flag, unit
  loss scale and the grad norm's sum (`megatron.core.utils.local_multi_tensor_l2_norm`) with
  `device="cuda"`.
`cpu_shims()` patches the first four once; `cuda_is_cpu()` is a context, entered only around the
megatron-core calls that need it, in which "the CUDA device" is the CPU. On a GPU neither is used.
This module knows nothing about models or training.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor


def cpu_shims() -> None:
    """Let megatron-core run forward and backward on a CPU (idempotent)."""
    from megatron.core import utils
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):  # without Transformer Engine: plain torch.mm
        moe_utils.te_general_gemm = None
    if getattr(utils.GlobalMemoryBuffer.get_tensor, "_rlgw_cpu", False):
        return

    def get_tensor(
        self: Any, tensor_shape: Any, dtype: torch.dtype, name: str, mem_alloc_context: Any = None
    ) -> Tensor:
        n = 1
        for d in tensor_shape:
            n *= d
        key = (name, dtype)
        if key not in self.buffer or self.buffer[key].numel() < n:
            self.buffer[key] = torch.empty(n, dtype=dtype, device="cpu", requires_grad=False)
        return self.buffer[key][:n].view(*tensor_shape)

    get_tensor._rlgw_cpu = True  # type: ignore[attr-defined]
    utils.GlobalMemoryBuffer.get_tensor = get_tensor

    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    original = RotaryEmbedding.get_emb

    def get_emb(self: Any, *args: Any, **kwargs: Any) -> Tensor:
        # get_emb moves inv_freq to torch.cuda.current_device() when it is on the CPU; here the
        # CPU is the device, so for this call "the current CUDA device" is the CPU.
        with cuda_is_cpu():
            return original(self, *args, **kwargs)

    RotaryEmbedding.get_emb = get_emb


def _cpu(device: Any) -> Any:
    return "cpu" if device is not None and str(device).startswith("cuda") else device


class _TorchOnCpu:
    """`torch` as megatron-core's schedules see it inside `cuda_is_cpu`: `device="cuda"` means the CPU."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def zeros(*args: Any, device: Any = None, **kwargs: Any) -> Tensor:
        return torch.zeros(*args, device=_cpu(device), **kwargs)

    @staticmethod
    def empty(*args: Any, device: Any = None, **kwargs: Any) -> Tensor:
        return torch.empty(*args, device=_cpu(device), **kwargs)

    @staticmethod
    def ones(*args: Any, device: Any = None, **kwargs: Any) -> Tensor:
        return torch.ones(*args, device=_cpu(device), **kwargs)

    @staticmethod
    def tensor(*args: Any, device: Any = None, **kwargs: Any) -> Tensor:
        return torch.tensor(*args, device=_cpu(device), **kwargs)


# megatron-core's modules that make tensors with `device="cuda"`: the schedules, the norm helper in
# utils, and the optimizer's (loaded only with the distributed optimizer; each is imported before
# the calls that need the context, so the context patches the ones loaded)
_MAKE_CUDA_TENSORS = (
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.utils",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.clip_grads",
)


def _cuda_type(original: Any) -> Any:
    def type_(self: Tensor, dtype: Any = None, *args: Any, **kwargs: Any) -> Any:
        # the optimizer checks `param.type() == "torch.cuda.FloatTensor"`; a conversion is left alone
        if dtype is None and not args and not kwargs and self.device.type == "cpu":
            return original(self).replace("torch.", "torch.cuda.", 1)
        return original(self, dtype, *args, **kwargs)

    return type_


@contextlib.contextmanager
def cuda_is_cpu() -> Iterator[None]:
    """Within: `torch.cuda.current_device()` is the CPU, `synchronize` a no-op, `.cuda()` stays put,
    a CPU tensor's `.type()` names the CUDA type, and the `device="cuda"` tensors of megatron-core's
    schedules, utils and optimizer are made on the CPU. Restored on exit."""
    import sys

    modules = [sys.modules[name] for name in _MAKE_CUDA_TENSORS if name in sys.modules]
    saved = (torch.cuda.current_device, torch.cuda.synchronize, Tensor.cuda, Tensor.type)
    saved_torch = [module.torch for module in modules]  # (the context nests: RoPE's get_emb enters it)
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    Tensor.type = _cuda_type(Tensor.type)  # type: ignore[method-assign]
    for module in modules:
        module.torch = _TorchOnCpu()  # type: ignore[attr-defined]
    try:
        yield
    finally:
        torch.cuda.current_device, torch.cuda.synchronize, Tensor.cuda, Tensor.type = saved
        for module, original in zip(modules, saved_torch, strict=True):
            module.torch = original  # type: ignore[attr-defined]
