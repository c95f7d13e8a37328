"""Hugging Face Llama/Qwen (dense, and Qwen3-MoE) weights to Megatron `GPTModel` ones and back,
whole or split over TP x PP x EP ranks.

Three layers, each the exact inverse of its partner (round trips are bit for bit):
- `hf_to_megatron` / `megatron_to_hf`: renaming and re-laying (QKV interleaved per query group,
  SwiGLU's gate and up in one `linear_fc1`, for the dense MLP and for each expert), global layer
  and expert numbers, the HF vocabulary. A MoE layer (Qwen3-MoE: `mlp.gate` routes over
  `mlp.experts.{e}`) becomes megatron-core's `mlp.router` and `mlp.experts.local_experts.{e}`
  (a `SequentialMLP`: no grouped GEMM); `decoder_sparse_step` / `mlp_only_layers` say which
  layers are MoE (`moe_layers`).
- `shard` / `unshard`: one rank's piece of that whole state, as megatron-core's local layer spec
  lays it out: vocab-parallel embedding and output layer (rows padded to `padded_vocab`, zeros in
  the padding), column-parallel `linear_qkv` (whole query groups per rank) and `linear_fc1` (each
  rank a slice of gate then the same slice of up), row-parallel `linear_proj` and `linear_fc2`,
  norms (including Qwen3's q/k norms) and the router replicated; pipeline stage `s` holds layers
  [s * L / pp, (s + 1) * L / pp) under local numbers, the embedding on the first stage, the final
  norm and the output layer on the last (with tied embeddings and pp > 1 the last stage keeps a
  copy of the embedding as its output layer, as megatron-core does); expert-parallel rank `r`
  holds experts [r * E / ep, (r + 1) * E / ep) under local numbers, each cut over TP as the dense
  MLP is (megatron-core's default expert tensor-parallel size: tp; the trainer does not yet train
  a MoE model at tp > 1).
This module knows nothing about process groups or models; `megatron_trainer` applies it per rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

SUPPORTED = {"qwen3", "qwen2", "llama", "mistral", "qwen3_moe"}
_VOCAB = ("embedding.word_embeddings.weight", "output_layer.weight")
_COLUMN = ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias")
_ROW = ("self_attention.linear_proj.weight", "linear_fc2.weight")  # the dense MLP's and each expert's
_GATED = "linear_fc1.weight"
_EXPERTS = "mlp.experts.local_experts."
# Per-layer tensors that only change name (HF suffix, Megatron suffix); Qwen3's q/k norms only where present.
_RENAMED = (
    ("input_layernorm.weight", "input_layernorm.weight"),
    ("self_attn.o_proj.weight", "self_attention.linear_proj.weight"),
    ("self_attn.q_norm.weight", "self_attention.q_layernorm.weight"),
    ("self_attn.k_norm.weight", "self_attention.k_layernorm.weight"),
    ("post_attention_layernorm.weight", "pre_mlp_layernorm.weight"),
)
_OPTIONAL = frozenset({"self_attn.q_norm.weight", "self_attention.q_layernorm.weight",
                       "self_attn.k_norm.weight", "self_attention.k_layernorm.weight"})  # fmt: skip


def _rename(out: dict[str, Tensor], state: dict[str, Tensor], src: str, dst: str, pairs: Any) -> None:
    """Copy layer `src`'s renamed tensors into `out` under prefix `dst` (`pairs`: (from, to) suffixes)."""
    for a, b in pairs:
        if a in _OPTIONAL and src + a not in state:
            continue
        out[dst + b] = state[src + a]


@dataclass(frozen=True, slots=True)
class Split:
    """How the model is cut: tensor-, pipeline- and expert-parallel sizes (data parallelism copies it;
    megatron-core takes the expert-parallel ranks from the data-parallel ones)."""

    tp: int = 1
    pp: int = 1
    ep: int = 1


def num_experts(hf: dict[str, Any]) -> int:
    """Routed experts per MoE layer (0 for a dense model); HF saves Qwen3-MoE's as `num_local_experts`."""
    return int(hf.get("num_experts") or hf.get("num_local_experts") or 0)


def moe_layers(hf: dict[str, Any]) -> list[bool]:
    """Which layers are MoE, as Qwen3-MoE decides: those not in `mlp_only_layers` whose number
    (from 1) is a multiple of `decoder_sparse_step`."""
    if not num_experts(hf):
        return [False] * hf["num_hidden_layers"]
    step, dense = hf.get("decoder_sparse_step", 1), set(hf.get("mlp_only_layers") or ())
    return [i not in dense and (i + 1) % step == 0 for i in range(hf["num_hidden_layers"])]


def heads(hf: dict[str, Any]) -> tuple[int, int, int]:
    """(query heads, query groups, head dim) of a HF config."""
    n = hf["num_attention_heads"]
    return n, hf.get("num_key_value_heads", n), hf.get("head_dim") or hf["hidden_size"] // n


def padded_vocab(vocab: int, tp: int, divisible_by: int = 128) -> int:
    """Megatron-LM's rule: the vocabulary rounded up to a multiple of `divisible_by * tp`."""
    m = divisible_by * tp
    return -(-vocab // m) * m


def check_split(hf: dict[str, Any], split: Split) -> None:
    """Refuse a split the model's shapes do not divide into (megatron-core would fail later, less clearly)."""
    n, groups, _ = heads(hf)
    problems = []
    if groups % split.tp:
        problems.append(f"{groups} query groups (num_key_value_heads) are not divisible by tp={split.tp}")
    if n % split.tp:
        problems.append(f"{n} attention heads are not divisible by tp={split.tp}")
    moe = moe_layers(hf)
    if not all(moe) and hf["intermediate_size"] % split.tp:
        problems.append(f"intermediate_size {hf['intermediate_size']} is not divisible by tp={split.tp}")
    if any(moe) and hf["moe_intermediate_size"] % split.tp:
        problems.append(
            f"moe_intermediate_size {hf['moe_intermediate_size']} is not divisible by tp={split.tp}"
        )
    if split.ep > 1 and not any(moe):
        problems.append(f"ep={split.ep} needs a MoE model (this one has no experts)")
    elif num_experts(hf) % split.ep:
        problems.append(f"{num_experts(hf)} experts are not divisible by ep={split.ep}")
    if hf["num_hidden_layers"] % split.pp:
        problems.append(f"{hf['num_hidden_layers']} layers are not divisible by pp={split.pp}")
    if problems:
        raise ValueError("cannot split the model: " + "; ".join(problems))


def hf_to_megatron(hf: dict[str, Any], state: dict[str, Tensor]) -> dict[str, Tensor]:
    """HF Llama/Qwen weights as an unsharded Megatron `GPTModel` state dict (local layer spec)."""
    _, groups, d = heads(hf)
    per = heads(hf)[0] // groups
    out = {"embedding.word_embeddings.weight": state["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": state["model.norm.weight"]}  # fmt: skip
    if not hf.get("tie_word_embeddings", False):
        out["output_layer.weight"] = state["lm_head.weight"]
    for i in range(hf["num_hidden_layers"]):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        q = state[h + "self_attn.q_proj.weight"].view(groups, per * d, -1)
        k = state[h + "self_attn.k_proj.weight"].view(groups, d, -1)
        v = state[h + "self_attn.v_proj.weight"].view(groups, d, -1)
        # Megatron keeps q, k and v of each query group together: [g0: q.. k v, g1: q.. k v, ...]
        out[m + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], 1).reshape(-1, q.shape[-1])
        if h + "self_attn.q_proj.bias" in state:
            qb = state[h + "self_attn.q_proj.bias"].view(groups, per * d)
            kb = state[h + "self_attn.k_proj.bias"].view(groups, d)
            vb = state[h + "self_attn.v_proj.bias"].view(groups, d)
            out[m + "self_attention.linear_qkv.bias"] = torch.cat([qb, kb, vb], 1).reshape(-1)
        _rename(out, state, h, m, _RENAMED)
        out.update(_mlp_to_megatron(hf, state, h, m, moe_layers(hf)[i]))
    return out


def _gated(state: dict[str, Tensor], h: str) -> tuple[Tensor, Tensor]:
    """SwiGLU's gate and up in one `linear_fc1`, its down as `linear_fc2` (HF prefix `h`: `...mlp.`)."""
    gate_up = torch.cat([state[h + "gate_proj.weight"], state[h + "up_proj.weight"]], 0)
    return gate_up, state[h + "down_proj.weight"]


def _mlp_to_megatron(
    hf: dict[str, Any], state: dict[str, Tensor], h: str, m: str, moe: bool
) -> dict[str, Tensor]:
    if not moe:
        fc1, fc2 = _gated(state, h + "mlp.")
        return {m + "mlp." + _GATED: fc1, m + "mlp.linear_fc2.weight": fc2}
    out = {m + "mlp.router.weight": state[h + "mlp.gate.weight"]}
    for e in range(num_experts(hf)):
        fc1, fc2 = _gated(state, f"{h}mlp.experts.{e}.")
        out[f"{m}{_EXPERTS}{e}.{_GATED}"], out[f"{m}{_EXPERTS}{e}.linear_fc2.weight"] = fc1, fc2
    return out


def _mlp_to_hf(hf: dict[str, Any], state: dict[str, Tensor], m: str, h: str, moe: bool) -> dict[str, Tensor]:
    def gated(src: str, dst: str) -> dict[str, Tensor]:
        gate, up = state[src + _GATED].chunk(2, 0)
        return {dst + "gate_proj.weight": gate, dst + "up_proj.weight": up,
                dst + "down_proj.weight": state[src + "linear_fc2.weight"]}  # fmt: skip

    if not moe:
        return gated(m + "mlp.", h + "mlp.")
    out = {h + "mlp.gate.weight": state[m + "mlp.router.weight"]}
    for e in range(num_experts(hf)):
        out.update(gated(f"{m}{_EXPERTS}{e}.", f"{h}mlp.experts.{e}."))
    return out


def megatron_to_hf(hf: dict[str, Any], state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The inverse of `hf_to_megatron` (HF names and shapes, for weight sync)."""
    n, groups, d = heads(hf)
    per = n // groups
    out = {"model.embed_tokens.weight": state["embedding.word_embeddings.weight"],
           "model.norm.weight": state["decoder.final_layernorm.weight"]}  # fmt: skip
    if "output_layer.weight" in state and not hf.get("tie_word_embeddings", False):
        out["lm_head.weight"] = state["output_layer.weight"]
    for i in range(hf["num_hidden_layers"]):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        qkv = state[m + "self_attention.linear_qkv.weight"].view(groups, (per + 2) * d, -1)
        out[h + "self_attn.q_proj.weight"] = qkv[:, : per * d].reshape(-1, qkv.shape[-1])
        out[h + "self_attn.k_proj.weight"] = qkv[:, per * d : (per + 1) * d].reshape(-1, qkv.shape[-1])
        out[h + "self_attn.v_proj.weight"] = qkv[:, (per + 1) * d :].reshape(-1, qkv.shape[-1])
        if m + "self_attention.linear_qkv.bias" in state:
            b = state[m + "self_attention.linear_qkv.bias"].view(groups, (per + 2) * d)
            out[h + "self_attn.q_proj.bias"] = b[:, : per * d].reshape(-1)
            out[h + "self_attn.k_proj.bias"] = b[:, per * d : (per + 1) * d].reshape(-1)
            out[h + "self_attn.v_proj.bias"] = b[:, (per + 1) * d :].reshape(-1)
        _rename(out, state, m, h, [(b, a) for a, b in _RENAMED])
        out.update(_mlp_to_hf(hf, state, m, h, moe_layers(hf)[i]))
    return out


def _stage_layers(hf: dict[str, Any], pp: int, stage: int) -> range:
    per = hf["num_hidden_layers"] // pp
    return range(stage * per, (stage + 1) * per)


def _expert(rest: str) -> tuple[int, str] | None:
    """(expert number, the rest) of a layer-local name (`mlp.experts.local_experts.3.linear_fc1.weight`)."""
    if not rest.startswith(_EXPERTS):
        return None
    e, after = rest.removeprefix(_EXPERTS).split(".", 1)
    return int(e), after


def _owner(name: str, hf: dict[str, Any], split: Split, stage: int, ep_rank: int) -> str | None:
    """The local name of global tensor `name` on (pipeline stage `stage`, expert-parallel rank
    `ep_rank`), or None if that rank lacks it."""
    first, last = stage == 0, stage == split.pp - 1
    if name.startswith("decoder.layers."):
        i, rest = name.removeprefix("decoder.layers.").split(".", 1)
        layers = _stage_layers(hf, split.pp, stage)
        if int(i) not in layers:
            return None
        if (expert := _expert(rest)) is not None:
            per = num_experts(hf) // split.ep
            e, after = expert
            if e // per != ep_rank:
                return None
            rest = f"{_EXPERTS}{e % per}.{after}"
        return f"decoder.layers.{int(i) - layers.start}.{rest}"
    if name == "embedding.word_embeddings.weight":
        return name if first else None
    return name if last else None  # final norm, output layer


def _tp_piece(name: str, t: Tensor, tp: int, rank: int, vocab_rows: int) -> Tensor:
    if name.endswith(_VOCAB):
        pad = t.new_zeros((vocab_rows - t.shape[0], *t.shape[1:]))
        return torch.cat([t, pad], 0).chunk(tp, 0)[rank].clone()
    if name.endswith(_COLUMN):
        return t.chunk(tp, 0)[rank].clone()
    if name.endswith(_ROW):
        return t.chunk(tp, 1)[rank].clone()
    if name.endswith(_GATED):
        gate, up = t.chunk(2, 0)
        return torch.cat([gate.chunk(tp, 0)[rank], up.chunk(tp, 0)[rank]], 0)
    return t.clone()


def shard(
    hf: dict[str, Any],
    full: dict[str, Tensor],
    split: Split,
    tp_rank: int,
    pp_rank: int,
    vocab_rows: int,
    ep_rank: int = 0,
) -> dict[str, Tensor]:
    """The local state dict of rank (`tp_rank`, `pp_rank`, `ep_rank`) from the whole Megatron state `full`.

    `vocab_rows` is the padded vocabulary the model was built with (`padded_vocab`).
    """
    check_split(hf, split)
    out = {}
    for name, t in full.items():
        local = _owner(name, hf, split, pp_rank, ep_rank)
        if local is not None:
            out[local] = _tp_piece(name, t, split.tp, tp_rank, vocab_rows)
    tied = hf.get("tie_word_embeddings", False)
    if tied and split.pp > 1 and pp_rank == split.pp - 1:
        emb = full["embedding.word_embeddings.weight"]
        out["output_layer.weight"] = _tp_piece("output_layer.weight", emb, split.tp, tp_rank, vocab_rows)
    return out


def _tp_whole(name: str, pieces: list[Tensor], vocab: int) -> Tensor:
    if name.endswith(_VOCAB):
        return torch.cat(pieces, 0)[:vocab]
    if name.endswith(_COLUMN):
        return torch.cat(pieces, 0)
    if name.endswith(_ROW):
        return torch.cat(pieces, 1)
    if name.endswith(_GATED):
        halves = [p.chunk(2, 0) for p in pieces]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], 0)
    return pieces[0]


def _global(hf: dict[str, Any], split: Split, local: str, stage: int, ep_rank: int) -> str | None:
    """The whole-state name of `local` on (`stage`, `ep_rank`); None for what expert-parallel rank
    `ep_rank` > 0 only repeats (everything but its experts)."""
    if not local.startswith("decoder.layers."):
        return local if ep_rank == 0 else None
    i, rest = local.removeprefix("decoder.layers.").split(".", 1)
    expert = _expert(rest)
    if expert is None and ep_rank > 0:
        return None
    if expert is not None:
        e, after = expert
        rest = f"{_EXPERTS}{ep_rank * num_experts(hf) // split.ep + e}.{after}"
    return f"decoder.layers.{int(i) + _stage_layers(hf, split.pp, stage).start}.{rest}"


def unshard(
    hf: dict[str, Any], pieces: dict[tuple[int, int, int], dict[str, Tensor]], split: Split
) -> dict[str, Tensor]:
    """The whole Megatron state from every rank's local state, keyed by (tp_rank, pp_rank, ep_rank).

    Replicated tensors are taken from tensor-parallel rank 0, and all but the experts from
    expert-parallel rank 0; the padded vocabulary rows are dropped; with tied embeddings the last
    stage's copy of the embedding is not part of the whole state.
    """
    vocab = hf["vocab_size"]
    tied = hf.get("tie_word_embeddings", False)
    out: dict[str, Tensor] = {}
    for stage in range(split.pp):
        for ep_rank in range(split.ep):
            for local in pieces[(0, stage, ep_rank)]:
                name = _global(hf, split, local, stage, ep_rank)
                if name is None or (tied and local == "output_layer.weight"):
                    continue
                tp_pieces = [pieces[(r, stage, ep_rank)][local] for r in range(split.tp)]
                out[name] = _tp_whole(local, tp_pieces, vocab)
    return out
