"""HF -> Megatron -> sharded over TP x PP -> whole -> HF round-trips bit for bit (no process groups)."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from safetensors.torch import load_file

from rlgw.trainer import megatron_convert as mc
from rlgw.trainer.megatron_convert import Split
from tests.support.procs import FIXTURES


def _model(name: str, *, untied: bool = False, bias: bool = False):
    hf = json.loads((FIXTURES / name / "config.json").read_text())
    state = load_file(str(FIXTURES / name / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    if untied:  # an untied output layer that differs from the embedding
        hf["tie_word_embeddings"] = False
        emb = state["model.embed_tokens.weight"]
        state["lm_head.weight"] = torch.randn(emb.shape, generator=g).to(emb.dtype)
    if bias:  # Qwen2's q/k/v biases
        for i in range(hf["num_hidden_layers"]):
            for p in ("q", "k", "v"):
                w = state[f"model.layers.{i}.self_attn.{p}_proj.weight"]
                state[f"model.layers.{i}.self_attn.{p}_proj.bias"] = torch.randn(w.shape[0], generator=g)
    return hf, state


CASES = [("tiny-qwen3", False, False), ("tiny-qwen3", True, True), ("tiny-chatml", False, False)]
SPLITS = [Split(tp, pp) for tp, pp in itertools.product((1, 2), (1, 2))]


@pytest.mark.parametrize("split", SPLITS, ids=lambda s: f"tp{s.tp}pp{s.pp}")
@pytest.mark.parametrize(("name", "untied", "bias"), CASES, ids=["qwen3-tied", "qwen3-untied-bias", "llama"])
@pytest.mark.parametrize("divisible_by", [128, 100], ids=["vocab-exact", "vocab-padded"])
def test_round_trip_is_bit_for_bit(
    name: str, untied: bool, bias: bool, split: Split, divisible_by: int
) -> None:
    hf, state = _model(name, untied=untied, bias=bias)
    rows = mc.padded_vocab(hf["vocab_size"], split.tp, divisible_by)
    full = mc.hf_to_megatron(hf, state)
    pieces = {(t, p): mc.shard(hf, full, split, t, p, rows) for t in range(split.tp) for p in range(split.pp)}
    back = mc.megatron_to_hf(hf, mc.unshard(hf, pieces, split))
    assert set(back) == set(state)
    for k, v in state.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
    # each rank holds its share: 1/tp of the padded vocabulary (zeros past the real one), whole query groups
    last = (split.tp - 1, split.pp - 1)
    emb_name = "output_layer.weight" if (untied or split.pp > 1) else "embedding.word_embeddings.weight"
    emb = pieces[last][emb_name]
    assert emb.shape[0] == rows // split.tp
    assert not emb[hf["vocab_size"] - rows + rows // split.tp :].any()
    _, groups, d = hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]
    per = hf["num_attention_heads"] // groups
    qkv = pieces[(0, 0)]["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert qkv.shape[0] == groups // split.tp * (per + 2) * d
    layers = {k.split(".")[2] for k in pieces[last] if k.startswith("decoder.layers.")}
    assert layers == {str(i) for i in range(hf["num_hidden_layers"] // split.pp)}
    assert ("embedding.word_embeddings.weight" in pieces[last]) == (split.pp == 1)


def test_gate_and_up_are_split_separately() -> None:
    hf, state = _model("tiny-qwen3")
    full = mc.hf_to_megatron(hf, state)
    piece = mc.shard(hf, full, Split(tp=2), 1, 0, mc.padded_vocab(hf["vocab_size"], 2))
    fc1 = piece["decoder.layers.0.mlp.linear_fc1.weight"]
    half = hf["intermediate_size"] // 2
    assert torch.equal(fc1[:half], state["model.layers.0.mlp.gate_proj.weight"][half:])
    assert torch.equal(fc1[half:], state["model.layers.0.mlp.up_proj.weight"][half:])


def test_splits_the_shapes_do_not_divide_are_refused() -> None:
    hf, _ = _model("tiny-qwen3")
    with pytest.raises(ValueError, match=r"2 query groups .* tp=4"):
        mc.check_split(hf, Split(tp=4))
    with pytest.raises(ValueError, match=r"2 layers are not divisible by pp=3"):
        mc.check_split(hf, Split(pp=3))
