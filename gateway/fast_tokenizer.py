"""Which encoder turns rendered prompt text into ids: bpe-qwen for Qwen's BPE, HF `tokenizers` otherwise.

Tokenizing each turn's rendered increment is the largest single cost of a turn. `bpe-qwen` (a
Rust implementation of Qwen's byte-level BPE) encodes the same text about 15x faster than HF
`tokenizers`, but only for tokenizers built exactly like Qwen's: NFC normalizer, Qwen's split
regex, byte-level mapping, plain BPE merges. `select_encoder` picks it only for such a tokenizer,
and only after it gave the same ids as HF `tokenizers` on a built-in corpus at start-up (code,
unicode, CJK, emoji, CRLF, whitespace runs, every added token); otherwise, and for every other
model, HF `tokenizers` (the reference) encodes.

bpe-qwen is given only the vocabulary and the merges (written once into a cache directory), so
it knows no added tokens: `BpeQwenEncoder` splits text on the HF added-token table itself
(leftmost-longest, as HF's added vocabulary matches) and maps those pieces to their ids. The
pieces between them go to bpe-qwen only when they are plain ASCII (`bpe_qwen_safe`): on some
non-ASCII text bpe-qwen 0.1.5 splits differently from Qwen's regex, so that goes to HF.

This module does not render, does not decide what is new in a conversation, and never decodes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

logger = logging.getLogger(__name__)

# Qwen2/2.5/3's pre-tokenizer split (tokenizer.json, "pre_tokenizer"); bpe-qwen hard-codes it.
QWEN_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
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
)


class TextEncoder(Protocol):
    """Rendered text -> ids, special tokens parsed, no BOS/EOS added (templates write their own)."""

    name: str

    def encode(self, text: str) -> list[int]:
        """The ids of `text`."""
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


# ASCII whitespace other than space, "\n" and "\r": bpe-qwen 0.1.5 keeps a run of them before a
# non-space together where Qwen's `\s+(?!\S)` splits them one by one.
_ASCII_RISKY = "\t\x0b\x0c\x1c\x1d\x1e\x1f"


def bpe_qwen_safe(text: str) -> bool:
    """Whether bpe-qwen 0.1.5 encodes `text` as HF `tokenizers` does: ASCII without tab-like whitespace.

    Measured over every code point in seventeen contexts, bpe-qwen's pre-tokenizer departs from
    Qwen's regex on runs of tabs and non-ASCII whitespace (NBSP, U+2000-U+200A, U+3000), after
    two or more spaces before a combining mark, a non-ASCII digit or an enclosed letter (it
    classifies characters as Rust's alphabetic/numeric, not `\\p{L}`/`\\p{N}`), and on some
    unassigned code points. Checking a text for those classes costs about what HF's encoding of
    it does, so non-ASCII text simply goes to HF; agents' traffic (code, JSON, shell output) is
    mostly ASCII. The test is two C scans (about 3 us for 4 kB).
    """
    return text.isascii() and not any(c in text for c in _ASCII_RISKY)


class BpeQwenEncoder:
    """bpe-qwen for the text between added tokens; the HF added-token table for the tokens themselves.

    HF splits on added tokens first and pre-tokenizes each piece between them on its own, so
    the pieces can be encoded independently: those bpe-qwen may split differently
    (`bpe_qwen_safe` is False) go to HF `tokenizers` instead.
    """

    name = "bpe-qwen"

    def __init__(self, bpe: Any, added: dict[str, int], fallback: Callable[[str], list[int]]) -> None:
        self._bpe_encode: Callable[[str], list[int]] = bpe.encode
        self._fallback = fallback
        self._added = added
        # Longest first: Python's alternation takes the first alternative that matches at a
        # position, so this is HF's leftmost-longest match.
        alternatives = sorted(added, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, alternatives)) + ")").split if added else None

    def _piece(self, text: str) -> list[int]:
        return self._bpe_encode(text) if bpe_qwen_safe(text) else self._fallback(text)

    def encode(self, text: str) -> list[int]:
        """The ids of `text`: pieces between added tokens through bpe-qwen, added tokens mapped."""
        if self._split is None:
            return self._piece(text)
        parts = self._split(text)
        ids: list[int] = []
        piece, added = self._piece, self._added
        # re.split with one group alternates text, token, text, ...: odd positions are tokens.
        for i, part in enumerate(parts):
            if i % 2:
                ids.append(added[part])
            elif part:
                ids.extend(piece(part))
        return ids


def qwen_bpe_mismatch(spec: dict) -> str | None:
    """Why a tokenizer.json is not Qwen's byte-level BPE as bpe-qwen implements it (None: it is)."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return f"model type {model.get('type')!r}, not BPE"
    for key in ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            return f"BPE option {key}={model[key]!r}"
    if model.get("byte_fallback") or model.get("ignore_merges"):
        return "BPE byte_fallback or ignore_merges is set"
    if spec.get("normalizer") != {"type": "NFC"}:
        return f"normalizer {spec.get('normalizer')!r}, not NFC"
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) != 2:
        return "pre-tokenizer is not Split + ByteLevel"
    split, byte_level = steps
    if (
        split.get("type") != "Split"
        or split.get("pattern") != {"Regex": QWEN_SPLIT_REGEX}
        or split.get("behavior") != "Isolated"
        or split.get("invert")
    ):
        return "pre-tokenizer split is not Qwen's regex"
    if (
        byte_level.get("type") != "ByteLevel"
        or byte_level.get("add_prefix_space")
        or byte_level.get("use_regex")
    ):
        return "pre-tokenizer is not a plain ByteLevel"
    for token in spec.get("added_tokens") or []:
        flags = [k for k in ("lstrip", "rstrip", "single_word", "normalized") if token.get(k)]
        if flags:
            return f"added token {token['content']!r} sets {flags}"
    return None


def _cache_root() -> Path:
    root = os.environ.get("RLGW_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "rlgw") / "bpe-qwen"


def _prepared_dir(raw: str, spec: dict) -> Path:
    """A directory holding vocab.json and merges.txt for bpe-qwen and the reference tokenizer.json.

    Written once per distinct tokenizer (keyed by the tokenizer.json's content) and renamed
    into place whole, so concurrent start-ups either find it complete or write their own.
    """
    target = _cache_root() / hashlib.sha256(raw.encode()).hexdigest()[:32]
    if (target / "reference.json").is_file():
        return target
    model = spec["model"]
    # tokenizers writes merges as ["a", "b"] pairs (older files: "a b" strings); byte-level
    # tokens never hold a space, so "a b" lines are unambiguous.
    merges = "\n".join(m if isinstance(m, str) else " ".join(m) for m in model["merges"])
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    (tmp / "vocab.json").write_text(json.dumps(model["vocab"], ensure_ascii=False), encoding="utf-8")
    (tmp / "merges.txt").write_text("#version: 0.2\n" + merges + "\n", encoding="utf-8")
    # Not named tokenizer.json or tokenizer_config.json: bpe-qwen must not read added tokens.
    (tmp / "reference.json").write_text(raw, encoding="utf-8")
    try:
        tmp.rename(target)
    except OSError:  # another process got there first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def self_check_texts(added: list[str]) -> list[str]:
    """The built-in corpus: fixed texts, each added token inside text, and this module's source."""
    texts = list(_SELF_CHECK_TEXTS)
    texts.append("".join(f"x{t}\n{t}{t} {t}y" for t in added))
    texts.append("<|im_start" + "".join(t[:-1] + " " + t[1:] for t in added))  # near misses
    texts.append(Path(__file__).read_text(encoding="utf-8"))
    return texts


def _build_checked(directory: Path, reference: Callable[[str], list[int]]) -> BpeQwenEncoder | str:
    """bpe-qwen on `directory`, checked against `reference` on the built-in corpus, or why not."""
    from bpe_qwen import bpe_qwen

    spec = json.loads((directory / "reference.json").read_text(encoding="utf-8"))
    added = {t["content"]: int(t["id"]) for t in spec.get("added_tokens") or []}
    encoder = BpeQwenEncoder(bpe_qwen.QwenTokenizer(str(directory)), added, reference)
    for text in self_check_texts(list(added)):
        ours, ref = encoder.encode(text), reference(text)
        if ours != ref:
            at = next((i for i, (a, b) in enumerate(zip(ours, ref, strict=False)) if a != b), len(ref))
            return (
                f"self-check differs on {text[:30]!r} at id {at}: {ours[at : at + 3]} != {ref[at : at + 3]}"
            )
    return encoder


def _verdict(directory: Path) -> str | None:
    """Whether bpe-qwen builds and checks equal on `directory` (None) or why not; cached on disk.

    The first check of a tokenizer runs in a child process: bpe-qwen aborts the whole process
    (a Rust panic, not an exception) on a vocabulary whose tokens do not encode to themselves
    under its merge order, and a gateway must fall back rather than die at start-up.
    """
    from importlib.metadata import version

    cached = directory / f"verdict-{version('bpe-qwen')}.json"
    if cached.is_file():
        return json.loads(cached.read_text())["reason"]
    cmd = [sys.executable, "-m", "rlgw.gateway.fast_tokenizer", str(directory)]
    try:
        env = {**os.environ, "RUST_BACKTRACE": "0"}
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    except subprocess.TimeoutExpired:
        return "the bpe-qwen check timed out"  # not cached: a busy machine is no verdict
    if done.returncode == 0:
        reason = json.loads(done.stdout.strip().splitlines()[-1])["reason"]
    else:
        lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("note:")]
        reason = f"bpe-qwen failed to build (exit {done.returncode}): {' '.join(lines[:2])[:300]}"
    cached.write_text(json.dumps({"reason": reason}))
    return reason


_built: dict[str, TextEncoder | str] = {}
_lock = threading.Lock()


def _select(raw: str, reference: HFEncoder) -> TextEncoder | str:
    spec = json.loads(raw)
    if reason := qwen_bpe_mismatch(spec):
        return reason
    if importlib.util.find_spec("bpe_qwen") is None:
        return "bpe-qwen is not installed"
    directory = _prepared_dir(raw, spec)
    if reason := _verdict(directory):
        return reason
    return _build_checked(directory, reference.encode)


def select_encoder(tokenizer: Any, *, prefer_fast: bool = True) -> TextEncoder:
    """The encoder for `tokenizer`'s rendered text: bpe-qwen when it is Qwen's BPE and checks equal.

    `prefer_fast=False` (or RLGW_FAST_TOKENIZER=0) always returns HF `tokenizers`. Building
    bpe-qwen for a 150k vocabulary takes seconds (once per distinct tokenizer per process; the
    first time ever, twice: see `_verdict`); the outcome and its reason are logged.
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
                logger.info("tokenizer %s: encoding with bpe-qwen (self-check passed)", name)
        outcome = _built[key]
    return reference if isinstance(outcome, str) else outcome


def main() -> None:
    """Child-process check (see `_verdict`): prints {"reason": null | str} for the directory in argv."""
    from tokenizers import Tokenizer

    directory = Path(sys.argv[1])
    hf = Tokenizer.from_file(str(directory / "reference.json"))
    outcome = _build_checked(directory, lambda text: hf.encode(text, add_special_tokens=False).ids)
    print(json.dumps({"reason": outcome if isinstance(outcome, str) else None}))


if __name__ == "__main__":
    main()
