"""What a plain Hugging Face forward routes: the reference the engine's and the trainer's routing meet."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import torch


def hf_routing(model_dir: Path, ids: list[int]) -> np.ndarray:
    """int32 [len(ids), layers, top_k]: each MoE router's top-k over `ids` in one uncached HF forward
    (a dense layer's rows 0, as SGLang reports them)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    cfg = model.config
    table = np.zeros((len(ids), cfg.num_hidden_layers, cfg.num_experts_per_tok), dtype=np.int32)
    for i, layer in enumerate(model.model.layers):
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None:

            def keep(_m, _in, out, i=i) -> None:
                table[:, i] = out[2].numpy()

            gate.register_forward_hook(keep)
    with torch.no_grad():
        model(torch.tensor([ids]))
    return table


def decode_routed_experts(encoded: str, layers: int, top_k: int) -> np.ndarray:
    """SGLang's `meta_info["routed_experts"]`: base64 of little-endian int32 [rows, layers, top_k]."""
    return np.frombuffer(base64.b64decode(encoded), dtype="<i4").reshape(-1, layers, top_k)
