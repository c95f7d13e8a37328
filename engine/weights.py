"""Live weights: plan an update against the model, apply it, read safetensors checkpoint directories.

Owns the checks that make a weight update all-or-nothing (every name, shape and dtype, and tied
parameters, validated before any byte is copied) and the reading of a checkpoint directory (one
file, several, or index-sharded). Names are the checkpoint's: an MoE checkpoint names each expert
(`mlp.experts.E.gate_proj.weight`, as Qwen3-MoE's are saved and published) where transformers keeps
the experts fused in memory (`mlp.experts.gate_up_proj[E]`, gate rows then up rows, and
`mlp.experts.down_proj[E]`); such a name updates its slice of the fused parameter. Knows nothing
about requests or the step loop: `Engine.update_weights` (`rlgw.engine.core`) holds admission,
waits for a quiet moment and takes the step lock around `apply`; the sync transports
(`rlgw.sync.engine_routes`) only hand in named tensors.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import torch

from rlgw.engine.errors import WeightUpdateError

Plan = list[tuple[torch.Tensor, torch.Tensor]]  # (live parameter, new value)

MAX_LISTED_PROBLEMS = 10


def plan_update(model: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Plan:
    """Match `named_tensors` (HF names) to `model`'s parameters; `WeightUpdateError` lists every misfit."""
    targets = model.state_dict(keep_vars=True)
    problems: list[str] = []
    plan: Plan = []
    seen: dict[int, tuple[str, torch.Tensor]] = {}
    for name, tensor in named_tensors:
        target = targets.get(name)
        if target is None:
            target = _expert_slice(targets, name)
        if target is None:
            problems.append(f"unknown parameter {name!r}")
            continue
        if tuple(tensor.shape) != tuple(target.shape):
            problems.append(f"{name}: shape {tuple(tensor.shape)} != model's {tuple(target.shape)}")
            continue
        if tensor.dtype != target.dtype:
            problems.append(f"{name}: dtype {tensor.dtype} != model's {target.dtype}")
            continue
        # Tied parameters (e.g. embed_tokens / lm_head) share storage: two different values for
        # one storage cannot both be applied.
        key = target.data_ptr()
        if key in seen and not torch.equal(seen[key][1], tensor):
            problems.append(f"{name} is tied to {seen[key][0]} but the update gives them different values")
            continue
        seen[key] = (name, tensor)
        plan.append((target, tensor))
    if problems:
        more = len(problems) - MAX_LISTED_PROBLEMS
        shown = "; ".join(problems[:MAX_LISTED_PROBLEMS]) + (f"; and {more} more" if more > 0 else "")
        raise WeightUpdateError(f"weight update refused, nothing changed: {shown}")
    if not plan:
        raise WeightUpdateError("weight update refused: no tensors given")
    return plan


_EXPERT = re.compile(r"(.+\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")


def _expert_slice(targets: dict[str, torch.Tensor], name: str) -> torch.Tensor | None:
    """The view of a fused experts parameter that the per-expert checkpoint `name` is, or None."""
    m = _EXPERT.fullmatch(name)
    if m is None:
        return None
    base, expert, proj = m[1], int(m[2]), m[3]
    fused = targets.get(f"{base}.down_proj" if proj == "down_proj" else f"{base}.gate_up_proj")
    if fused is None or fused.dim() != 3 or expert >= fused.shape[0]:
        return None
    if proj == "down_proj":
        return fused[expert]
    half = fused.shape[1] // 2
    return fused[expert, :half] if proj == "gate_proj" else fused[expert, half:]


def apply(plan: Plan) -> None:
    """Copy every planned tensor into its live parameter (the caller holds the step lock)."""
    with torch.no_grad():
        for target, tensor in plan:
            target.data.copy_(tensor)


def read_safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors checkpoint directory (single file, several, or index-sharded)."""
    import orjson
    from safetensors.torch import load_file

    if not path.is_dir():
        raise WeightUpdateError(f"checkpoint directory {path} does not exist")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = orjson.loads(index.read_bytes()).get("weight_map", {})
        files = sorted({path / f for f in weight_map.values()})
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightUpdateError(f"no safetensors files in {path}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        if not f.is_file():
            raise WeightUpdateError(f"checkpoint shard {f} is missing")
        tensors.update(load_file(str(f)))
    return tensors
