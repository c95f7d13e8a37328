"""Incremental detokenization on real tokenizers: deltas concatenate to the full decode."""

from __future__ import annotations

import random
from typing import Any

import pytest
from transformers import AutoTokenizer

from rlgw.gateway.parsing.detokenize import IncrementalDetokenizer
from tests.support.procs import FIXTURES
from tests.support.real_tokenizers import qwen3_tokenizer

MULTIBYTE = (
    "Résumé: 日本語のテキスト, emoji 🌸👩‍👩‍👧 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math, Ελληνικά, עברית, "
    "combining e\u0301, tabs\tand\n\nnewlines, code `x = {'a': 1}`."
)


def qwen3_ids() -> list[int]:
    """A Qwen3 reply with reasoning, a tool call and the special end token."""
    tok = qwen3_tokenizer()
    call = '<tool_call>\n{"name": "f"}\n</tool_call>'
    text = f"<think>\nPlan: {MULTIBYTE}\n</think>\n\n{MULTIBYTE}\n{call}"
    return [*tok.encode(text), tok.convert_tokens_to_ids("<|im_end|>")]


def stream(detok: IncrementalDetokenizer, ids: list[int], sizes: list[int]) -> list[str]:
    """Feed `ids` in pieces of the given sizes, then flush; return every delta."""
    out, pos = [], 0
    for size in sizes:
        out.append(detok.feed(ids[pos : pos + size]))
        pos += size
    out.append(detok.feed(ids[pos:]))
    out.append(detok.flush())
    return out


def random_sizes(rng: random.Random, n: int) -> list[int]:
    sizes = []
    while sum(sizes) < n:
        sizes.append(rng.choice([0, 1, 1, 1, 2, 3, 7]))
    return sizes


@pytest.mark.parametrize("skip", [True, False])
def test_qwen3_one_id_at_a_time_matches_full_decode_and_never_splits_a_character(skip):
    tok = qwen3_tokenizer()
    ids = qwen3_ids()
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    deltas = stream(detok, ids, [1] * len(ids))
    full = tok.decode(ids, skip_special_tokens=skip)
    assert "".join(deltas) == full
    assert not any("\ufffd" in d for d in deltas)  # the text has none, so no delta may show one
    # Non-special added tokens survive; the special end token only when not skipped.
    assert "<think>" in full and "<tool_call>" in full
    assert full.endswith("</tool_call>") == skip


def test_partial_character_is_held_back_until_completed():
    tok = qwen3_tokenizer()
    ids = tok.encode("a𝔘b")  # 𝔘 is two byte-level tokens, each an incomplete UTF-8 sequence
    assert len(ids) == 4
    detok = IncrementalDetokenizer(tok)
    assert detok.feed(ids[:1]) == "a"
    assert detok.feed(ids[1:2]) == ""  # first half of 𝔘: nothing yet
    assert detok.feed(ids[2:3]) == "𝔘"
    assert detok.feed(ids[3:]) == "b"
    assert detok.flush() == ""


def test_never_completed_bytes_come_out_at_flush():
    tok = qwen3_tokenizer()
    lone_lead_byte = tok.convert_tokens_to_ids("ð")  # byte 0xF0: starts a 4-byte sequence
    ids = [*tok.encode("tail"), lone_lead_byte]
    detok = IncrementalDetokenizer(tok)
    assert detok.feed(ids) == ""  # held as a whole: the text ends in U+FFFD
    assert detok.flush() == "tail\ufffd" == tok.decode(ids)
    assert detok.flush() == ""


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_ids_in_random_chunks_match_full_decode(seed):
    """Arbitrary sampled ids (broken byte sequences, specials, added tokens) and chunkings."""
    tok = qwen3_tokenizer()
    rng = random.Random(seed)
    specials = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<think>", "</think>", "<tool_call>")]
    ids = [rng.randrange(len(tok)) if rng.random() < 0.9 else rng.choice(specials) for _ in range(600)]
    ids += qwen3_ids()
    for skip in (True, False):
        detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
        deltas = stream(detok, ids, random_sizes(rng, len(ids)))
        assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip)


class _CountingTokenizer:
    """The real Qwen3 tokenizer, recording how many ids each backend decode call sees."""

    def __init__(self, tok: Any) -> None:
        self.inner = tok.backend_tokenizer
        self.clean_up_tokenization_spaces = tok.clean_up_tokenization_spaces
        self.window_sizes: list[int] = []
        self.backend_tokenizer = self

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        self.window_sizes.append(len(ids))
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


def test_decode_window_stays_small_as_the_output_grows():
    tok = qwen3_tokenizer()
    ids = qwen3_ids() * 20
    counting = _CountingTokenizer(tok)
    detok = IncrementalDetokenizer(counting)
    text = "".join(stream(detok, ids, [1] * len(ids)))
    assert text == tok.decode(ids, skip_special_tokens=True)
    assert len(ids) > 1000
    # Two short decodes per id; the window is bounded by the longest run of ids that do not
    # complete a character (plus one step of context), never by the output length.
    assert max(counting.window_sizes) <= 8
    assert len(counting.window_sizes) <= 2 * len(ids) + 2


@pytest.mark.parametrize("fixture", ["tiny-chatml", "tiny-qwen3"])
def test_fixture_tokenizers_match_full_decode(fixture):
    """SmolLM2's tokenizer (tiny-chatml) and the small Qwen3-style BPE (more byte fragments)."""
    if not (FIXTURES / fixture / "tokenizer.json").is_file():
        pytest.skip(f"tests/fixtures/{fixture} not built")
    tok = AutoTokenizer.from_pretrained(FIXTURES / fixture)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    ids = [*tok.encode(f"<|im_start|>assistant\n{MULTIBYTE}", add_special_tokens=False), end]
    rng = random.Random(7)
    for skip in (True, False):
        for sizes in ([1] * len(ids), random_sizes(rng, len(ids))):
            detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
            assert "".join(stream(detok, ids, sizes)) == tok.decode(ids, skip_special_tokens=skip)
