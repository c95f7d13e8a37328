"""Which encoder turns rendered prompt text into ids: fastokens where proven equal, else HF `tokenizers`.

Tokenizing each turn's rendered increment is the largest single cost of a turn. `fastokens` (a
Rust reimplementation of HF `tokenizers`' encoding pipeline, Apache-2.0) encodes the same text
about 100x faster than HF `tokenizers` here, and 8x faster than `bpe-qwen`, which it replaced
(bench/encoders.py). `select_encoder` picks it only for a byte-level BPE tokenizer (Qwen2/2.5/3,
Llama 3, SmolLM2, GPT-2 style: the family its equality was proven on, tests/gateway/
test_fast_tokenizer.py), and only after it gave the same ids as HF `tokenizers` on a built-in
corpus at start-up (code, unicode, CJK, emoji, CRLF, whitespace runs, every added token);
otherwise, and for every other model, HF `tokenizers` (the reference) encodes.

A text fastokens refuses (a byte-level vocabulary with no token for one of its bytes, as
SmolLM2's has none for 0xF1 and 0xF2) is encoded by HF `tokenizers` instead, so the answer
is always HF's.

This module does not render, does not decide what is new in a conversation, and never decodes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

logger = logging.getLogger(__name__)

# Text the self-check encodes both ways: what agents send (code, prose in many scripts, JSON,
# shell output) and what tokenizers trip over (combining marks, CRLF, long runs, digits).
_SELF_CHECK_TEXTS = (
    "Hello, world! It's a test: we'll see what they've done, I'm sure you'd agree.",
    "def f(x: int) -> list[int]:\n    return [i ** 2 for i in range(x) if i % 3 != 0]\n\n\n# done\n",
    "line one\r\nline two\r\n\r\n\tindented\ttabs\t\t\n   \n",
    "数学是研究数量、结构以及空间等概念的学科。日本語のテキスト、한국어 문장",
    "Ελληνικά, русский текст, العربية, हिन्दी, ไทย, עברית",
    "emoji: 🎉🚀👩‍👩‍👧‍👦 🇫🇷 ✔️ flags and ZWJ sequences 🧑🏽‍💻",
    "combining: e\u0301 a\u0308 n\u0303 (NFD) vs é ä ñ (NFC); ligature ﬁ; fullwidth ＡＢＣ１２３",
    '{"name": "bash", "arguments": {"command": "ls -la /tmp && cat \\"file.txt\\" | grep -n \'x\'"}}',
    "numbers 1234567890 3.14159 -42 1e-9 0x1F 2026-11-30T19:57:10Z",
    "a" * 300 + " " * 200 + "\n" * 50 + "=" * 120 + "\u3000" * 10,
    "total 48\ndrwxr-xr-x  5 root root 4096 Nov 30 19:57 .\n-rw-r--r--  1 root root  220 README.md\n",
    "  leading spaces, trailing spaces   \n\n  \n mixed \u00a0nbsp\u2009thin\u200bzero-width",
    "\t\tx = 1\n\xa0\xa01 a\u3000\u3000b   \u0661\u0662  \u00b2  \u24b6 x  \u0e37\u0e37",
)


class TextEncoder(Protocol):
    """Rendered text -> ids, special tokens parsed, no BOS/EOS added (templates write their own)."""

    name: str

    def encode(self, text: str) -> list[int]:
        """The ids of `text`."""
        ...

    def encode_array(self, text: str) -> np.ndarray:
        """The ids of `text` as an int32 array."""
        ...


class HFEncoder:
    """HF `tokenizers` (the reference): the Rust backend directly when the tokenizer is a fast one.

    A fast tokenizer's backend gives the same ids as `encode(..., add_special_tokens=False)`
    with less Python per call; a slow (Python) tokenizer goes through its own `encode`.
    """

    def __init__(self, tokenizer: Any) -> None:
        backend = tokenizer.backend_tokenizer if getattr(tokenizer, "is_fast", False) else None
        if backend is not None:
            self.name = "tokenizers"
            self.encode: Callable[[str], list[int]] = lambda text: (
                backend.encode(text, add_special_tokens=False).ids
            )
        else:
            self.name = "transformers-slow"
            self.encode = lambda text: tokenizer.encode(
                text, add_special_tokens=False, split_special_tokens=False
            )

    def encode_array(self, text: str) -> np.ndarray:
        """The ids of `text` as an int32 array."""
        return np.asarray(self.encode(text), dtype=np.int32)


class FastokensEncoder:
    """fastokens, with HF `tokenizers` for the texts it refuses."""

    name = "fastokens"

    def __init__(self, fast: Any, fallback: Callable[[str], list[int]]) -> None:
        self._fast_encode = fast.encode
        self._fast_flat = fast.encode_batch_flat
        self._fallback = fallback

    def encode(self, text: str) -> list[int]:
        """The ids of `text`, added tokens included."""
        try:
            return self._fast_encode(text, add_special_tokens=False).ids
        except ValueError:  # "byte 0xf1 has no token in vocabulary": what HF does then is the answer
            return self._fallback(text)

    def encode_array(self, text: str) -> np.ndarray:
        """The ids of `text` as an int32 array, with no Python int per id (a third of `encode`'s
        time and the list-to-array copy saved: ids come as little-endian uint32 bytes, all < 2**31)."""
        try:
            return np.frombuffer(self._fast_flat([text])[0], dtype="<i4")
        except ValueError:
            return np.asarray(self._fallback(text), dtype=np.int32)


def _has_byte_level(step: dict | None) -> bool:
    if not step:
        return False
    if step.get("type") == "Sequence":
        return any(_has_byte_level(s) for s in step.get("pretokenizers") or [])
    return step.get("type") == "ByteLevel"


def byte_level_bpe_mismatch(spec: dict) -> str | None:
    """Why a tokenizer.json is not a plain byte-level BPE, where fastokens was proven (None: it is)."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return f"model type {model.get('type')!r}, not BPE"
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            return f"BPE option {key}={model[key]!r}"
    if model.get("byte_fallback"):
        return "BPE byte_fallback is set (SentencePiece-style, not byte-level)"
    if spec.get("normalizer") not in (None, {"type": "NFC"}):
        return f"normalizer {spec.get('normalizer')!r}, neither none nor NFC"
    if not _has_byte_level(spec.get("pre_tokenizer")):
        return "the pre-tokenizer has no ByteLevel step"
    return None


def self_check_texts(added: list[str]) -> list[str]:
    """The built-in corpus: fixed texts, each added token inside text, and this module's source."""
    texts = list(_SELF_CHECK_TEXTS)
    texts.append("".join(f"x{t}\n{t}{t} {t}y" for t in added))
    texts.append("<|im_start" + "".join(t[:-1] + " " + t[1:] for t in added))  # near misses
    texts.append(Path(__file__).read_text(encoding="utf-8"))
    return texts


def _build_checked(raw: str, spec: dict, reference: Callable[[str], list[int]]) -> FastokensEncoder | str:
    """fastokens for the tokenizer.json `raw`, checked against `reference` on the built-in corpus."""
    import fastokens

    try:
        encoder = FastokensEncoder(fastokens.Tokenizer.from_json_str(raw), reference)
    except Exception as exc:  # a tokenizer.json fastokens cannot load: HF encodes
        return f"fastokens cannot load the tokenizer: {exc}"
    added = [t["content"] for t in spec.get("added_tokens") or []]
    for text in self_check_texts(added):
        ref = reference(text)
        for ours in (encoder.encode(text), encoder.encode_array(text).tolist()):
            if ours != ref:
                at = next((i for i, (a, b) in enumerate(zip(ours, ref, strict=False)) if a != b), len(ref))
                got, want = ours[at : at + 3], ref[at : at + 3]
                return f"self-check differs on {text[:30]!r} at id {at}: {got} != {want}"
    return encoder


_built: dict[str, TextEncoder | str] = {}
_lock = threading.Lock()


def _select(raw: str, reference: HFEncoder) -> TextEncoder | str:
    spec = json.loads(raw)
    if reason := byte_level_bpe_mismatch(spec):
        return reason
    if importlib.util.find_spec("fastokens") is None:
        return "fastokens is not installed"
    return _build_checked(raw, spec, reference.encode)


def select_encoder(tokenizer: Any, *, prefer_fast: bool = True) -> TextEncoder:
    """The encoder for `tokenizer`'s rendered text: fastokens when it is a byte-level BPE that checks equal.

    `prefer_fast=False` (or RLGW_FAST_TOKENIZER=0) always returns HF `tokenizers`. Loading
    fastokens for a 150k vocabulary takes about 2 s (once per distinct tokenizer per process);
    the outcome and its reason are logged.
    """
    reference = HFEncoder(tokenizer)
    if not prefer_fast or os.environ.get("RLGW_FAST_TOKENIZER", "1") == "0" or reference.name != "tokenizers":
        return reference
    raw = tokenizer.backend_tokenizer.to_str()
    key = hashlib.sha256(raw.encode()).hexdigest()
    with _lock:
        if key not in _built:
            _built[key] = outcome = _select(raw, reference)
            name = tokenizer.name_or_path
            if isinstance(outcome, str):
                logger.info("tokenizer %s: encoding with HF tokenizers (%s)", name, outcome)
            else:
                logger.info("tokenizer %s: encoding with fastokens (self-check passed)", name)
        outcome = _built[key]
    return reference if isinstance(outcome, str) else outcome
