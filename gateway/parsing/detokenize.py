"""Incremental detokenization: the engine's output ids, as text, piece by piece.

`IncrementalDetokenizer` turns a growing list of sampled ids into text deltas whose
concatenation is exactly ``tokenizer.decode(all_ids, skip_special_tokens=...)``. It decodes only
a small window around the boundary (vLLM's and SGLang's prefix/read offsets): the ids already
emitted in the previous step are decoded again as context, so byte-level merges and
leading-space rules see the same left context as a full decode, and the difference between the
two decodes is the new text. A delta that ends in U+FFFD (an incomplete UTF-8 character) is held
back until more ids complete it, or until `flush`.

Text is for the agent and for humans only; training uses the ids (docs/ARCHITECTURE.md, token provenance).
This module knows nothing about parsing or HTTP.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

_REPLACEMENT = "\ufffd"


@functools.lru_cache(maxsize=16)
def _decoder(tokenizer: Any, skip_special_tokens: bool) -> Callable[[Sequence[int]], str]:
    """The cheapest call that decodes exactly as ``tokenizer.decode(ids, skip_special_tokens=...)``.

    Made once per tokenizer: a transformers tokenizer's attributes cost a `__getattr__` each,
    and a detokenizer is made every turn."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        # A fast tokenizer without clean-up decodes with its Rust backend alone; skipping the
        # Python wrapper saves most of the per-call cost on short windows.
        return lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


class IncrementalDetokenizer:
    """Decodes one generation's ids incrementally; O(new ids) per `feed`.

    `tokenizer` is a transformers tokenizer. Added tokens that are not special (Qwen3's
    ``<think>``, ``<tool_call>``) are kept in the text; special ones (``<|im_end|>``) are dropped
    when `skip_special_tokens` is true.
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self._decode = _decoder(tokenizer, skip_special_tokens)
        self._ids: list[int] = []
        self._prefix_offset = 0  # start of the context window (ids already emitted)
        self._read_offset = 0  # first id whose text is not yet emitted
        self._prefix_text = ""  # decode(ids[prefix_offset:read_offset])

    def feed(self, ids: Sequence[int]) -> str:
        """Append `ids`; return the text they complete (may be empty while a character is partial)."""
        if len(ids) == 0:  # not `not ids`: a numpy array has no truth value
            return ""
        self._ids.extend(int(i) for i in ids)
        text = self._decode(self._ids[self._prefix_offset :])
        if len(text) <= len(self._prefix_text) or text.endswith(_REPLACEMENT):
            return ""
        return self._advance(text)

    def flush(self) -> str:
        """Return whatever is still held back (a trailing U+FFFD that never completed)."""
        if self._read_offset == len(self._ids):
            return ""
        return self._advance(self._decode(self._ids[self._prefix_offset :]))

    def _advance(self, text: str) -> str:
        new = text[len(self._prefix_text) :]
        # The ids just emitted become the next window's context. When the window had no
        # context (the first piece, or all of a non-streamed turn), that is what was just decoded.
        fresh = self._prefix_offset == self._read_offset
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        window = self._ids[self._prefix_offset : self._read_offset]
        self._prefix_text = text if fresh else self._decode(window)
        return new


class StopTrimmer:
    """Holds back text that may be the start of a stop string, so the agent never sees one.

    The engine's ids include the tokens that matched a stop string (they were sampled, and
    the ledger keeps them); only the text for the agent is trimmed, as SGLang does.
    """

    def __init__(self, stops: list[str]) -> None:
        self._stops = [s for s in stops if s]
        self._hold = max((len(s) for s in self._stops), default=0) + 8 if self._stops else 0
        self._buf = ""

    def feed(self, text: str) -> str:
        """Text that is safe to pass on now."""
        if not self._hold:
            return text
        self._buf += text
        if len(self._buf) <= self._hold:
            return ""
        out, self._buf = self._buf[: -self._hold], self._buf[-self._hold :]
        return out

    def close(self, matched: Any) -> str:
        """The held text, cut at `matched` if the generation stopped on that stop string."""
        buf, self._buf = self._buf, ""
        if isinstance(matched, str) and matched:
            i = buf.find(matched)
            if i >= 0:
                buf = buf[:i]
        return buf
