"""What vLLM's logprobs are, measured against the served model's own logits (transformers, float32).

The served fixture is padded: its config's `vocab_size` (4096 rows of the LM head) exceeds the
tokenizer's 4026 ids. Teacher-forcing 64 random ids makes the model unsure, so whether the 70 padded rows
enter the normalization shows (up to 1.6e-2 in a logprob). Measured on vLLM 0.32.0 in its default
`logprobs_mode` (`raw_logprobs`), with temperature 0.5 on the request (largest distances, one run):

- prompt logprobs (`prompt_logprobs`) and sampled logprobs are both `log_softmax(logits)` over all
  `config.vocab_size` rows, the padded ones included (3.8e-6 and 1.6e-6 from it; 1.6e-2 and 1.2e-4 from
  the normalization over the tokenizer's ids), and the request's temperature is not applied (18.9 and
  0.82 from `log_softmax(logits / 0.5)`);
- which is what `metadata.engine` says of a vLLM sample (`"logprobs": "raw"`).

Slow and skipped unless the vLLM venv is built (`python -m tests.support.vllm_env`).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.support.e2e import Stack

pytestmark = pytest.mark.slow
TEMPERATURE = 0.5


def _log_softmaxes(model: Path, ids: list[int], vocab: int) -> dict[str, np.ndarray]:
    """Per position, the next token's log-softmax three ways: over the config's rows, over the
    tokenizer's ids only, and over the config's rows at `TEMPERATURE`."""
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    with torch.no_grad():
        logits = lm(torch.tensor([ids])).logits[0]
    return {
        "config": torch.log_softmax(logits, -1).numpy(),
        "tokenizer": torch.log_softmax(logits[:, :vocab], -1).numpy(),
        "tempered": torch.log_softmax(logits / TEMPERATURE, -1).numpy(),
    }


def _closest(
    got: list[float], ids: list[int], rows: list[int], ways: dict[str, np.ndarray]
) -> dict[str, float]:
    """The largest distance of `got` from each way's logprob of `ids` (predicted at `rows`)."""
    return {name: float(np.abs(np.asarray(got) - lp[rows, ids]).max()) for name, lp in ways.items()}


def test_vllm_logprobs_are_raw_over_the_configs_vocabulary(vllm_qwen3: Stack, qwen3_hd64: Path) -> None:
    tok = vllm_qwen3.tokenizer
    prompt = np.random.default_rng(0).integers(10, len(tok), 64).tolist()
    sampling = {"temperature": TEMPERATURE, "seed": 1, "max_tokens": 8, "logprobs": 0, "prompt_logprobs": 0}
    r = httpx.post(
        vllm_qwen3.engine + "/inference/v1/generate",
        json={"token_ids": prompt, "sampling_params": sampling, "output_mode": "tokens"},
        timeout=300,
    )
    r.raise_for_status()
    doc = r.json()
    choice = doc["choices"][0]
    out = choice["token_ids"]
    sampled = [e["logprob"] for e in choice["logprobs"]["content"]]
    forced = [doc["prompt_logprobs"][i][str(t)]["logprob"] for i, t in enumerate(prompt) if i > 0]
    ways = _log_softmaxes(qwen3_hd64, prompt + out, len(tok))

    # The padded rows matter at these positions: the two normalizations differ by more than rounding.
    gap = np.abs(ways["config"][: len(prompt) - 1, : len(tok)] - ways["tokenizer"][: len(prompt) - 1])
    assert gap.max() > 1e-3
    prompt_dist = _closest(forced, prompt[1:], list(range(len(prompt) - 1)), ways)
    assert prompt_dist["config"] < 5e-5, prompt_dist
    assert prompt_dist["tokenizer"] > 1e-3, prompt_dist
    assert prompt_dist["tempered"] > 1.0, prompt_dist

    sampled_dist = _closest(sampled, out, list(range(len(prompt) - 1, len(prompt) - 1 + len(out))), ways)
    assert sampled_dist["config"] < 5e-5, sampled_dist
    assert sampled_dist["tempered"] > 1e-2, sampled_dist
