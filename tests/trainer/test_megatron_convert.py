"""HF -> Megatron -> sharded over TP x PP (x EP) -> whole -> HF round-trips bit for bit (no processes)."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from safetensors.torch import load_file

from rlgw.trainer import megatron_convert as mc
from rlgw.trainer.megatron_convert import Split
from tests.support.procs import FIXTURES
from tests.trainer.support import tiny_qwen3_moe


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
    pieces = {
        (t, p, 0): mc.shard(hf, full, split, t, p, rows) for t in range(split.tp) for p in range(split.pp)
    }
    back = mc.megatron_to_hf(hf, mc.unshard(hf, pieces, split))
    assert set(back) == set(state)
    for k, v in state.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
    # each rank holds its share: 1/tp of the padded vocabulary (zeros past the real one), whole query groups
    last = (split.tp - 1, split.pp - 1, 0)
    emb_name = "output_layer.weight" if (untied or split.pp > 1) else "embedding.word_embeddings.weight"
    emb = pieces[last][emb_name]
    assert emb.shape[0] == rows // split.tp
    assert not emb[hf["vocab_size"] - rows + rows // split.tp :].any()
    _, groups, d = hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]
    per = hf["num_attention_heads"] // groups
    qkv = pieces[(0, 0, 0)]["decoder.layers.0.self_attention.linear_qkv.weight"]
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


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    """A tiny Qwen3-MoE (4 experts, 2 layers) whose second layer is dense (`mlp_only_layers`)."""
    out = tiny_qwen3_moe(tmp_path_factory.mktemp("moe"), mlp_only_layers=(1,))
    return json.loads((out / "config.json").read_text()), load_file(str(out / "model.safetensors"))


MOE_SPLITS = [Split(tp, pp, ep) for tp, pp, ep in itertools.product((1, 2), (1, 2), (1, 2))]


@pytest.mark.parametrize("split", MOE_SPLITS, ids=lambda s: f"tp{s.tp}pp{s.pp}ep{s.ep}")
def test_moe_round_trip_is_bit_for_bit(moe: tuple[dict, dict], split: Split) -> None:
    hf, state = moe
    assert mc.moe_layers(hf) == [True, False]
    rows = mc.padded_vocab(hf["vocab_size"], split.tp)
    full = mc.hf_to_megatron(hf, state)
    assert "decoder.layers.0.mlp.router.weight" in full and "decoder.layers.1.mlp.linear_fc1.weight" in full
    ranks = itertools.product(range(split.tp), range(split.pp), range(split.ep))
    pieces = {(t, p, e): mc.shard(hf, full, split, t, p, rows, e) for t, p, e in ranks}
    back = mc.megatron_to_hf(hf, mc.unshard(hf, pieces, split))
    assert set(back) == set(state)
    for k, v in state.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
    # expert-parallel rank e holds experts [2e, 2e + 2) of 4 as local 0 and 1, each cut over TP
    # like the dense MLP (a slice of gate, then the same slice of up); the router whole on every rank
    per, inter = 4 // split.ep, hf["moe_intermediate_size"] // split.tp
    for e in range(split.ep):
        piece = pieces[(split.tp - 1, 0, e)]
        local = {k.split(".")[6] for k in piece if ".local_experts." in k}
        assert local == {str(j) for j in range(per)}
        fc1 = piece[f"decoder.layers.0.mlp.experts.local_experts.{per - 1}.linear_fc1.weight"]
        gate = state[f"model.layers.0.mlp.experts.{e * per + per - 1}.gate_proj.weight"]
        up = state[f"model.layers.0.mlp.experts.{e * per + per - 1}.up_proj.weight"]
        assert torch.equal(fc1, torch.cat([gate[-inter:], up[-inter:]]))
        assert torch.equal(
            piece["decoder.layers.0.mlp.router.weight"], state["model.layers.0.mlp.gate.weight"]
        )


def test_moe_splits_the_shapes_do_not_divide_are_refused(moe: tuple[dict, dict]) -> None:
    hf, _ = moe
    with pytest.raises(ValueError, match=r"4 experts are not divisible by ep=3"):
        mc.check_split(hf, Split(ep=3))
    with pytest.raises(ValueError, match=r"moe_intermediate_size 32 is not divisible by tp=3"):
        mc.check_split({**hf, "num_attention_heads": 6, "num_key_value_heads": 3}, Split(tp=3))
    dense, _ = _model("tiny-qwen3")
    with pytest.raises(ValueError, match=r"ep=2 needs a MoE model"):
        mc.check_split(dense, Split(ep=2))
