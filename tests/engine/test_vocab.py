"""The padded vocabulary: logprobs over the model's whole vocabulary, as SGLang's; padded ids never sampled.

The committed tiny-qwen3 fixture pads its model vocabulary (4096) above its tokenizer's (4026), as
Qwen3 does; at temperature 2 about 1% of the mass sits on the padded ids. SGLang normalizes its
logprobs over `config.vocab_size` (padded ids included; ../shared/reference/SGLANG_CPU.md), and so
does this engine; it never samples a padded id (no text; `rlgw.engine.runner.ModelRunner` says why).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlgw.engine.core import Engine
from tests.engine.conftest import run_requests
from tests.support.procs import FIXTURES

PROMPT_TEXT = "Hello there, how are you? Tell me a story."


def test_fixture_model_vocab_is_padded() -> None:
    config = json.loads((FIXTURES / "tiny-qwen3" / "config.json").read_text())
    assert config["vocab_size"] == 4096  # the tokenizer has 4026 entries (checked below)


async def test_hot_sampling_stays_inside_the_tokenizer(padded_engine: Engine) -> None:
    n_tok = len(padded_engine.tokenizer)
    assert n_tok == 4026 < padded_engine.runner.vocab_size
    prompt = padded_engine.tokenizer.encode(PROMPT_TEXT)
    params = [
        {"temperature": 2.0, "top_k": 4096, "max_new_tokens": 96, "ignore_eos": True, "sampling_seed": seed}
        for seed in range(16)
    ]
    reqs = await run_requests(padded_engine, prompt, params, return_logprob=True, top_logprobs_num=8)
    sampled = [t for r in reqs for t in r.output_ids]
    assert len(sampled) == 16 * 96
    assert max(sampled) < n_tok, f"padded ids sampled: {sorted({t for t in sampled if t >= n_tok})}"


async def test_logprobs_are_over_the_whole_padded_vocabulary(padded_engine: Engine) -> None:
    """Output (at T) and prompt (raw) distributions sum to 1 over all 4096 ids, padded ones carrying
    mass, and equal a plain forward's log_softmax over the whole vocabulary."""
    n_tok = len(padded_engine.tokenizer)
    vocab = padded_engine.runner.vocab_size
    prompt = padded_engine.tokenizer.encode(PROMPT_TEXT)
    params = [{"temperature": 2.0, "max_new_tokens": 4, "sampling_seed": 1}]
    (req,) = await run_requests(
        padded_engine, prompt, params, return_logprob=True, logprob_start_len=0, top_logprobs_num=vocab
    )
    rows = req.output_top_logprobs + req.input_top_logprobs[1:]
    assert len(rows) == 4 + len(prompt) - 1
    padded_mass = []
    for row in rows:
        assert len(row) == vocab
        assert math.fsum(math.exp(v) for v, _ in row) == pytest.approx(1.0, abs=1e-4)
        padded_mass.append(math.fsum(math.exp(v) for v, i in row if i >= n_tok))
    assert min(padded_mass) > 0 and max(padded_mass) > 1e-3  # the padded ids are in the normalization
    with torch.no_grad():
        logits = padded_engine.model(torch.tensor([prompt + req.output_ids[:-1]])).logits[0].float()
    # Sampled tokens at T = 2: log_softmax(logits / 2); prompt tokens: the raw logits, whatever T.
    scaled = torch.log_softmax(logits[len(prompt) - 1 :] / 2.0, -1)
    want_out = scaled.gather(1, torch.tensor(req.output_ids)[:, None]).squeeze(1)
    torch.testing.assert_close(torch.tensor(req.output_logprobs), want_out, atol=1e-5, rtol=0)
    raw = torch.log_softmax(logits[: len(prompt) - 1], -1)
    want_in = raw.gather(1, torch.tensor(prompt[1:])[:, None]).squeeze(1)
    torch.testing.assert_close(torch.tensor(req.input_logprobs[1:]), want_in, atol=1e-5, rtol=0)
