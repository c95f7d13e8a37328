"""Issue 8, defect 10: the engine never samples, nor gives probability to, ids beyond the tokenizer.

The committed tiny-qwen3 fixture pads its model vocabulary (4096) above its tokenizer's (4026), as
Qwen3 does; at temperature 2 about 1% of the mass sits on the padded ids, so an unmasked engine
samples a few of them in a thousand tokens.
"""

from __future__ import annotations

import json
import math

import pytest

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
    assert all(i < n_tok for r in reqs for row in r.output_top_logprobs for _, i in row)


async def test_logprobs_are_over_the_tokenizer_vocabulary(padded_engine: Engine) -> None:
    """Output and prompt distributions put -inf on padded ids and sum to 1 over the real ones."""
    n_tok = len(padded_engine.tokenizer)
    vocab = padded_engine.runner.vocab_size
    prompt = padded_engine.tokenizer.encode(PROMPT_TEXT)
    params = [{"temperature": 2.0, "max_new_tokens": 4, "sampling_seed": 1}]
    (req,) = await run_requests(
        padded_engine, prompt, params, return_logprob=True, logprob_start_len=0, top_logprobs_num=vocab
    )
    rows = req.output_top_logprobs + req.input_top_logprobs[1:]
    assert len(rows) == 4 + len(prompt) - 1
    for row in rows:
        assert all(v == -math.inf for v, i in row if i >= n_tok)
        assert math.fsum(math.exp(v) for v, i in row if i < n_tok) == pytest.approx(1.0, abs=1e-4)
