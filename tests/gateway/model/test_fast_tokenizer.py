"""fastokens gives HF `tokenizers`' ids on a large corpus, and is chosen only where it is proven.

The corpus: Python stdlib sources (plain, CRLF and NFD variants), this repository's code and
docs, seeded random text over many scripts (CJK, Hangul, Arabic, Devanagari, emoji with ZWJ
and skin tones, combining marks, odd whitespace, control characters), long runs, and every added
token of the tokenizer placed inside, between and against text (`<|im_start|>`, `<tool_call>`,
`<think>`, near misses such as `<|im_start|`). Qwen3's tokenizer (NFC, Qwen's split regex)
and SmolLM2's (GPT-2's byte-level split, a vocabulary without tokens for some bytes) are the two
byte-level BPE shapes compared; a hypothesis property adds texts built from the same pieces.
"""

from __future__ import annotations

import json
import os
import random
import unicodedata
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from rlgw.gateway.model import fast_tokenizer
from rlgw.gateway.model.fast_tokenizer import (
    FastokensEncoder,
    HFEncoder,
    TextEncoder,
    byte_level_bpe_mismatch,
    select_encoder,
)
from tests.support.procs import REPO
from tests.support.real_tokenizers import chatml_tokenizer, qwen3_tokenizer

STDLIB = Path(os.__file__).parent
# Unicode ranges agents' text comes from, and the ones tokenizers trip over.
_BLOCKS = [
    (0x20, 0x7E),
    (0xA0, 0x24F),
    (0x300, 0x36F),  # combining marks
    (0x370, 0x3FF),
    (0x400, 0x4FF),
    (0x590, 0x6FF),
    (0x900, 0x97F),
    (0xE00, 0xE7F),
    (0x1100, 0x11FF),
    (0x2000, 0x206F),  # spaces, zero-width, joiners, punctuation
    (0x3000, 0x30FF),
    (0x4E00, 0x9FFF),
    (0xAC00, 0xD7A3),
    (0xFF00, 0xFFEF),
    (0x1F300, 0x1FAFF),  # emoji
    (0x1F3FB, 0x1F3FF),  # skin tones
]


def _random_text(rng: random.Random, added: list[str], n: int) -> str:
    pieces = []
    for _ in range(n):
        roll = rng.random()
        if roll < 0.05:
            pieces.append(rng.choice(added))
        elif roll < 0.08:
            token = rng.choice(added)
            pieces.append(token[: rng.randrange(1, len(token))])  # a near miss
        elif roll < 0.18:
            pieces.append(rng.choice([" ", "  ", "\n", "\r\n", "\t", "\n\n", " \n", "\r", "\x00", "\x0b"]))
        elif roll < 0.22:
            pieces.append(rng.choice(["'s", "'LL", "'re ", "don't", "1234567", "3.14", "ẞ", "İ"]))
        else:
            lo, hi = rng.choice(_BLOCKS)
            word = "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 12)))
            pieces.append(word if rng.random() < 0.6 else " " + word)
    return "".join(pieces)


def corpus(added: list[str], size: str) -> list[str]:
    """Texts to compare: `size` "large" reads ~7 MB of stdlib and repo sources, "small" ~0.3 MB."""
    files = sorted(STDLIB.glob("*.py"))
    files += [STDLIB / "test" / n for n in ("test_unicode.py", "test_codecs.py", "test_unicodedata.py")]
    files += sorted(REPO.glob("*/*.py")) + sorted(REPO.glob("*.md"))
    if size == "small":
        files = files[::40]
    texts = []
    for path in files:
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            texts += [text, text.replace("\n", "\r\n")]
            texts.append(unicodedata.normalize("NFD", text[:20000]))  # the normalizer must recompose
    rng = random.Random(20261130)
    texts += [_random_text(rng, added, rng.randint(1, 400)) for _ in range(2000 if size == "large" else 200)]
    texts += [
        " " * 5000,
        "a" * 10000,
        "\n" * 3000 + "x",
        "\r\n" * 2000,
        "\t \n" * 1500,
        "ab" * 4000,
        "😀" * 2000,
        "的" * 3000,
        "9" * 5000,
        "".join(added) * 20,
        # Inputs bpe-qwen 0.1.5 (the encoder before fastokens) split differently from HF.
        "\xa0\xa01",
        "\t\tx = 1",
        "a\u3000\u3000b",
        "  \u0900",
        "x  \u0e37\u0e37",
        "   \u0661\u0662",
        "  \u00b2",
        "  \u24b6",
        "\U000113c2\U000113c21",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<think>\n\n</think>\n\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
        "<|im_end|>\n<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n",
        "",
    ]
    return texts


def _assert_same_ids(encoder: FastokensEncoder, tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> None:
    # HF's ids (`HFEncoder`'s: the backend's `encode`), in one batch the backend spreads over the cores.
    references = [e.ids for e in tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)]
    differing = []
    n_ids = 0
    for text, ref in zip(texts, references, strict=True):
        ours, array = encoder.encode(text), encoder.encode_array(text)
        n_ids += len(ref)
        if ours != ref or array.dtype != np.int32 or array.tolist() != ref:
            differing.append(text[:60])
    assert not differing, f"{len(differing)} of {len(texts)} texts differ, e.g. {differing[:3]}"
    assert n_ids > len(texts)


def _added(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    return [t.content for t in tokenizer.added_tokens_decoder.values()]


@pytest.mark.slow
def test_real_qwen3_gives_hf_ids_on_a_large_corpus() -> None:
    tokenizer = qwen3_tokenizer()
    encoder = select_encoder(tokenizer)
    assert isinstance(encoder, FastokensEncoder)
    added = _added(tokenizer)
    assert {"<|im_start|>", "<tool_call>", "<think>", "</tool_response>"} <= set(added)
    texts = corpus(added, "large")
    assert sum(map(len, texts)) > 5_000_000
    _assert_same_ids(encoder, tokenizer, texts)


@pytest.mark.slow
def test_real_smollm2_gives_hf_ids_on_a_large_corpus_refused_texts_included() -> None:
    tokenizer = chatml_tokenizer()
    encoder = select_encoder(tokenizer)
    assert isinstance(encoder, FastokensEncoder)
    texts = corpus(_added(tokenizer), "large")
    _assert_same_ids(encoder, tokenizer, texts)


def test_tiny_qwen3_fixture_gives_hf_ids(tiny_qwen3: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
    encoder = select_encoder(tokenizer)
    assert isinstance(encoder, FastokensEncoder)
    _assert_same_ids(encoder, tokenizer, corpus(_added(tokenizer), "small"))


def test_texts_fastokens_refuses_get_hf_ids(tiny_chatml: Path) -> None:
    # SmolLM2's vocabulary has no token for the bytes 0xF1 and 0xF2 (lead bytes of planes 4-11):
    # fastokens raises where HF encodes (dropping the byte); the encoder answers with HF's ids.
    tokenizer = AutoTokenizer.from_pretrained(tiny_chatml)
    encoder = select_encoder(tokenizer)
    assert isinstance(encoder, FastokensEncoder)
    text = "plane 9: \U000968fb, then <|im_end|> and more"
    import fastokens

    with pytest.raises(ValueError, match="has no token"):
        fastokens.Tokenizer.from_json_str(tokenizer.backend_tokenizer.to_str()).encode(text)
    assert encoder.encode(text) == tokenizer.encode(text, add_special_tokens=False)
    assert encoder.encode_array(text).tolist() == tokenizer.encode(text, add_special_tokens=False)
    assert encoder.encode("plain text") == tokenizer.encode("plain text", add_special_tokens=False)


_PIECES = st.one_of(
    st.text(st.characters(codec="utf-8"), max_size=12),
    st.sampled_from([" ", "  ", "\n", "\r\n", "\t", "\n\n", " \n", "\u00a0", "\u3000", "e\u0301", "'s"]),
    st.sampled_from(["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "<|im_start|"]),
)


@cache
def _real_encoders() -> list[tuple[TextEncoder, HFEncoder]]:
    pairs = [(select_encoder(t), HFEncoder(t)) for t in (qwen3_tokenizer(), chatml_tokenizer())]
    assert [fast.name for fast, _ in pairs] == ["fastokens", "fastokens"]
    return pairs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pieces=st.lists(_PIECES, max_size=40))
def test_any_text_gets_hf_ids(pieces: list[str]) -> None:
    text = "".join(pieces)
    for fast, reference in _real_encoders():
        ref = reference.encode(text)
        assert fast.encode(text) == ref, repr(text)
        assert fast.encode_array(text).tolist() == ref, repr(text)


def test_added_tokens_are_split_and_mapped_like_hf(tiny_qwen3: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
    encoder = select_encoder(tokenizer)
    ids = tokenizer.convert_tokens_to_ids
    # <tool_call> is an added token that is not "special" in Qwen3: still one id, as in HF.
    assert encoder.encode("a<tool_call>b") == [*encoder.encode("a"), ids("<tool_call>"), *encoder.encode("b")]
    assert encoder.encode("<|im_end|><|im_start|>") == [ids("<|im_end|>"), ids("<|im_start|>")]
    assert ids("<|im_start|>") not in encoder.encode("<|im_start|")
    assert encoder.encode("") == []


def _word_level() -> PreTrainedTokenizerFast:
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def test_other_tokenizers_fall_back_to_hf(tiny_qwen3: Path, monkeypatch) -> None:
    word_level = _word_level()
    encoder = select_encoder(word_level)
    assert encoder.name == "tokenizers"
    assert encoder.encode("hello world") == [1, 2]
    qwen = AutoTokenizer.from_pretrained(tiny_qwen3)
    assert select_encoder(qwen, prefer_fast=False).name == "tokenizers"
    monkeypatch.setenv("RLGW_FAST_TOKENIZER", "0")
    assert select_encoder(qwen).name == "tokenizers"


def _spec(tiny_qwen3: Path) -> dict:
    return json.loads((tiny_qwen3 / "tokenizer.json").read_text())


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda s: s.update(normalizer={"type": "NFD"}), "normalizer"),
        (lambda s: s.update(pre_tokenizer={"type": "Whitespace"}), "ByteLevel"),
        (lambda s: s["model"].update(byte_fallback=True), "byte_fallback"),
        (lambda s: s["model"].update(dropout=0.1), "dropout"),
        (lambda s: s["model"].update(type="WordPiece"), "WordPiece"),
    ],
)
def test_tokenizers_unlike_byte_level_bpe_are_told_apart(tiny_qwen3: Path, change, reason: str) -> None:
    spec = _spec(tiny_qwen3)
    assert byte_level_bpe_mismatch(spec) is None
    change(spec)
    assert reason in byte_level_bpe_mismatch(spec)


def _fresh_tokenizer(tiny_qwen3: Path, tag: str) -> PreTrainedTokenizerFast:
    # A tokenizer.json no other test built (the outcome is kept per distinct tokenizer).
    spec = _spec(tiny_qwen3)
    spec["added_tokens"][-1]["content"] += tag
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)))


def test_a_tokenizer_fastokens_cannot_load_falls_back(tiny_qwen3: Path, monkeypatch, caplog) -> None:
    import fastokens

    def refuse(raw: str) -> None:
        raise ValueError("unsupported model type: Other")

    monkeypatch.setattr(fastokens.Tokenizer, "from_json_str", refuse)
    tokenizer = _fresh_tokenizer(tiny_qwen3, "-unloadable")
    with caplog.at_level("INFO", logger=fast_tokenizer.__name__):
        encoder = select_encoder(tokenizer)
    assert encoder.name == "tokenizers"
    assert "fastokens cannot load the tokenizer: unsupported model type" in caplog.text
    text = "hello <|im_end|>"
    assert encoder.encode(text) == tokenizer.encode(text, add_special_tokens=False)


def test_a_self_check_difference_falls_back(tiny_qwen3: Path, monkeypatch, caplog) -> None:
    # A fastokens that drops the last id of every text it encodes: the start-up check catches it.
    import fastokens

    real = fastokens.Tokenizer.from_json_str

    class Off:
        def __init__(self, raw: str) -> None:
            self._t = real(raw)

        def encode(self, text: str, add_special_tokens: bool = False):
            enc = self._t.encode(text, add_special_tokens=add_special_tokens)
            return type("E", (), {"ids": enc.ids[:-1]})()

        def encode_batch_flat(self, texts: list[str]) -> tuple[bytes, bytes]:
            ids, offsets = self._t.encode_batch_flat(texts)
            return ids[:-4], offsets

    monkeypatch.setattr(fastokens.Tokenizer, "from_json_str", Off)
    with caplog.at_level("INFO", logger=fast_tokenizer.__name__):
        encoder = select_encoder(_fresh_tokenizer(tiny_qwen3, "-off-by-one"))
    assert encoder.name == "tokenizers"
    assert "self-check differs" in caplog.text


def test_the_gateway_profile_renders_with_the_selected_encoder(tiny_qwen3: Path, tiny_chatml: Path) -> None:
    from rlgw.gateway.model.profile import build_profile

    qwen = build_profile({"tokenizer_path": str(tiny_qwen3), "max_context_length": 4096})
    assert qwen.renderer.encoder_name == "fastokens"
    messages = [{"role": "user", "content": "Hello, what is 2 + 2?"}]
    text = qwen.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    expected = qwen.tokenizer.encode(text, add_special_tokens=False)
    assert qwen.renderer.render_prompt(messages, None) == expected
    chatml = build_profile({"tokenizer_path": str(tiny_chatml), "max_context_length": 4096})
    assert chatml.renderer.encoder_name == "fastokens"
