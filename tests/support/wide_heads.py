"""The committed tiny fixtures with wider attention heads, computing the same function.

vLLM's CPU attention kernels refuse head_dim 16 (the committed fixtures' size), so the vLLM tests
serve a copy whose heads are `head_dim` wide (64 by default) and whose outputs equal the original's
up to float rounding, so the overfitted greedy answers (tool calls, think blocks) stay the same:

- query and key dims sit where rotary embedding gives them their old frequency: with the
  rotate-half layout, dim i < d/2 of a d-wide head turns at theta^(-2i/d) with partner i + d/2, so
  it moves to dim i*r (partner i*r + D/2) of the D-wide head, r = D/d; every other dim is zero;
- the softmax scale drops from 1/sqrt(d) to 1/sqrt(D), so the score is multiplied by sqrt(r):
  through the query projection (Llama), or through the key norm (Qwen3's per-head RMSNorm, which
  over D dims with only d non-zero already multiplies query and key by sqrt(r) each);
- values fill the first d dims of each head and `o_proj` reads only those.

A copy takes well under a second; tests build it into a temporary directory.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

COPIED = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json")


def _layout(d: int, wide: int) -> torch.Tensor:
    """Where each of a d-wide head's dims goes in a `wide` head (rotary pairs keep their frequency)."""
    r = wide // d
    half = torch.arange(d // 2) * r
    return torch.cat([half, half + wide // 2])


def _spread_rows(w: torch.Tensor, heads: int, d: int, wide: int, pos: torch.Tensor) -> torch.Tensor:
    """A projection's output rows (heads x d) moved to `pos` within heads x wide, zeros elsewhere."""
    out = torch.zeros(heads, wide, *w.shape[1:], dtype=w.dtype)
    out[:, pos] = w.reshape(heads, d, *w.shape[1:])
    return out.reshape(heads * wide, *w.shape[1:])


def widen_heads(src: Path, dst: Path, head_dim: int = 64, *, untie: bool = False) -> Path:
    """Write `src` (a Llama or Qwen3 checkpoint) with `head_dim`-wide heads to `dst`; returns `dst`.

    `untie`: write the LM head as its own tensor (a copy of the embedding) and clear
    `tie_word_embeddings`: the same function, but vLLM 0.32.0's in-place reload updates it (a tied
    head keeps its old weights there; docs/ENGINES.md).
    """
    cfg = json.loads((src / "config.json").read_text())
    d = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    if head_dim % d or head_dim <= d:
        raise ValueError(f"head_dim {head_dim} must be a multiple of {d} above it")
    if cfg["model_type"] not in ("llama", "qwen3"):
        raise ValueError(f"cannot widen a {cfg['model_type']!r} model (llama and qwen3 only)")
    r = head_dim // d
    q_heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    pos = _layout(d, head_dim)
    weights = load_file(str(src / "model.safetensors"))
    out: dict[str, torch.Tensor] = {}
    for name, w in weights.items():
        if name.endswith("self_attn.q_proj.weight"):
            w = _spread_rows(w, q_heads, d, head_dim, pos)
            if cfg["model_type"] == "llama":  # no query norm: the projection carries the scale
                w = w * math.sqrt(r)
        elif name.endswith("self_attn.k_proj.weight"):
            w = _spread_rows(w, kv_heads, d, head_dim, pos)
        elif name.endswith("self_attn.v_proj.weight"):
            w = _spread_rows(w, kv_heads, d, head_dim, torch.arange(d))
        elif name.endswith("self_attn.o_proj.weight"):
            cols = _spread_rows(w.T.contiguous(), q_heads, d, head_dim, torch.arange(d))
            w = cols.T.contiguous()
        elif name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
            norm = torch.zeros(head_dim, dtype=w.dtype)
            # The norm over `head_dim` dims already scales q and k by sqrt(r) each; the key's undoes one.
            norm[pos] = w if "q_norm" in name else w / math.sqrt(r)
            w = norm
        out[name] = w.contiguous()
    if untie and cfg.get("tie_word_embeddings"):
        out["lm_head.weight"] = out["model.embed_tokens.weight"].clone()
        cfg["tie_word_embeddings"] = False
    dst.mkdir(parents=True, exist_ok=True)
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg["head_dim"] = head_dim
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for name in COPIED:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    return dst
