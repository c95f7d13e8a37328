"""The sampling module on its own: SGLang's parameter checks, filters, seeds and logprob semantics."""

from __future__ import annotations

import math

import pytest
import torch

from rlgw.engine.sampling import (
    SamplerRow,
    SamplingParamsError,
    UnknownFieldError,
    make_generator,
    parse_sampling_params,
    sample,
)


def row(
    raw: dict | None = None, seed: int | None = 0, out: list[int] | None = None, suppress=None
) -> SamplerRow:
    p = parse_sampling_params(raw)
    return SamplerRow(p, make_generator(seed if seed is not None else p.sampling_seed), out or [], suppress)


def test_defaults_match_sglang() -> None:
    p = parse_sampling_params(None)
    assert (p.max_new_tokens, p.temperature, p.top_p, p.top_k, p.min_p, p.n) == (128, 1.0, 1.0, -1, 0.0, 1)
    assert p.skip_special_tokens and not p.ignore_eos and not p.no_stop_trim
    assert parse_sampling_params({"stop": "x"}).stop == ["x"]
    assert parse_sampling_params({"temperature": 5e-7}).greedy


def test_unknown_key_uses_serde_wording() -> None:
    with pytest.raises(UnknownFieldError) as exc:
        parse_sampling_params({"seed": 3})
    msg = str(exc.value)
    assert msg.startswith("unknown field `seed`, expected one of `max_new_tokens`, `stop`")
    assert "`sampling_seed`" in msg


@pytest.mark.parametrize(
    "raw",
    [
        {"top_p": 0},
        {"top_p": 1.5},
        {"temperature": -0.1},
        {"top_k": 0},
        {"min_p": 2},
        {"max_new_tokens": -1},
        {"min_new_tokens": 5, "max_new_tokens": 2},
        {"n": 0},
        {"frequency_penalty": 3},
        {"repetition_penalty": 0},
        {"max_new_tokens": "ten"},
        {"ignore_eos": "yes"},
        {"stop_token_ids": ["a"]},
        {"regex": "a+", "ebnf": 'root ::= "a"'},
        {"json_schema": {"type": "object"}},
        {"sampling_seed": 1.5},
    ],
)
def test_semantic_violations_are_refused(raw: dict) -> None:
    with pytest.raises(SamplingParamsError) as exc:
        parse_sampling_params(raw)
    assert not isinstance(exc.value, UnknownFieldError)


def test_greedy_takes_argmax_and_unscaled_logprobs() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, -1.0]])
    ids, lp = sample(logits, [row({"temperature": 0})])
    assert ids == [1]
    assert torch.allclose(lp, torch.log_softmax(logits, -1))


def test_logprobs_are_after_temperature_before_filters() -> None:
    torch.manual_seed(0)
    logits = torch.randn(1, 50)
    params = {"temperature": 0.5, "top_k": 3, "top_p": 0.9}
    ids, lp = sample(logits, [row(params)])
    assert torch.allclose(lp, torch.log_softmax(logits / 0.5, -1))
    assert ids[0] in logits[0].topk(3).indices.tolist()
    # The original-logprob switch returns the raw model distribution instead.
    _, raw = sample(logits, [row(params)], original_logprob=True)
    assert torch.allclose(raw, torch.log_softmax(logits, -1))


def test_ids_past_sample_vocab_keep_their_mass_but_are_never_drawn() -> None:
    """The model's padded ids: in the logprobs' normalization (as SGLang's), never sampled."""
    logits = torch.tensor([[0.0, 1.0, 5.0, 5.0]])
    for seed in range(50):
        ids, lp = sample(logits, [row({"temperature": 1.0}, seed)], sample_vocab=2)
        assert ids[0] in (0, 1)
        assert torch.allclose(lp, torch.log_softmax(logits, -1))
    assert sample(logits, [row({"temperature": 0})], sample_vocab=2)[0] == [1]


def test_top_k_top_p_min_p_restrict_support() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    seen = {p: set() for p in ("k1", "p", "minp")}
    for seed in range(200):
        seen["k1"].update(sample(logits, [row({"top_k": 1}, seed)])[0])
        seen["p"].update(sample(logits, [row({"top_p": 0.7}, seed)])[0])
        seen["minp"].update(sample(logits, [row({"min_p": 0.4}, seed)])[0])
    assert seen["k1"] == {0}
    assert seen["p"] == {0, 1}  # 0.5 < 0.7, 0.5 + 0.3 >= 0.7: the second token is kept, the third is not
    assert seen["minp"] == {0, 1}  # 0.15 < 0.4 * 0.5


def test_same_seed_same_tokens_regardless_of_neighbours() -> None:
    torch.manual_seed(1)
    logits = torch.randn(3, 1000)

    def draw(rows: list[SamplerRow], steps: int) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in rows]
        for _ in range(steps):
            ids, _ = sample(logits[: len(rows)], rows)
            for i, t in enumerate(ids):
                out[i].append(t)
        return out

    alone = draw([row({"sampling_seed": 7}, seed=7)], 20)[0]
    with_neighbours = draw([row({"sampling_seed": 7}, seed=7), row(seed=None), row(seed=None)], 20)[0]
    other_seed = draw([row({"sampling_seed": 8}, seed=8)], 20)[0]
    assert alone == with_neighbours
    assert alone != other_seed


def test_penalties_bias_and_suppression() -> None:
    logits = torch.tensor([[2.0, 1.9, 0.0, -5.0]])
    assert sample(logits, [row({"temperature": 0}, suppress=[0])])[0] == [1]
    assert sample(logits, [row({"temperature": 0, "logit_bias": {"3": 10.0}})])[0] == [3]
    # Token 0 was already generated twice: the frequency penalty pushes it below token 1.
    ids, lp = sample(logits, [row({"temperature": 0, "frequency_penalty": 0.1}, out=[0, 0])])
    assert ids == [1]
    expected = torch.log_softmax(torch.tensor([1.8, 1.9, 0.0, -5.0]), -1)
    assert math.isclose(float(lp[0, 1]), float(expected[1]), abs_tol=1e-6)
