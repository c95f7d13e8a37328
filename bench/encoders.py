"""Per-call cost of encoding a turn's rendered increment: HF `tokenizers`, fastokens, and bpe-qwen.

On the real Qwen3 tokenizer (and SmolLM2's), encodes tool-output-like text of about 800 and
8000 tokens, ASCII (shell output, code) and mixed-script (CJK, Cyrillic, emoji), with each
encoder the gateway could use: HF `tokenizers` (the reference), fastokens (what
`gateway/model/fast_tokenizer.py` selects), and bpe-qwen 0.1.5 (the encoder before it) when it is
installed (`pip install bpe-qwen==0.1.5`). Every encoder's ids are checked equal to HF's first.
Prints the median microseconds per call and each encoder's speed-up over HF and over fastokens.

    python bench/encoders.py [--repeats 200]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.gateway import filler, qwen3_tokenizer_dir
from rlgw.gateway.model.fast_tokenizer import FastokensEncoder, HFEncoder, select_encoder

MIXED = "数学是研究数量、结构以及空间等概念的学科。 русский текст, Ελληνικά, émoji 🎉 ok\n"


def _bpe_qwen(tok_dir: str) -> Callable[[str], list[int]] | None:
    """bpe-qwen on the tokenizer's vocab and merges (the texts here hold no added tokens)."""
    if importlib.util.find_spec("bpe_qwen") is None:
        return None
    from bpe_qwen import bpe_qwen

    return bpe_qwen.QwenTokenizer(tok_dir).encode


def median_us(fn: Callable[[str], list[int]], text: str, repeats: int) -> float:
    fn(text)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(text)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    tok_dir = qwen3_tokenizer_dir()
    tok = AutoTokenizer.from_pretrained(tok_dir)
    reference = HFEncoder(tok).encode
    fast = select_encoder(tok)
    assert isinstance(fast, FastokensEncoder), f"fastokens was not selected ({fast.name})"
    encoders: dict[str, Callable[[str], list[int]]] = {"tokenizers": reference, "fastokens": fast.encode}
    bpe = _bpe_qwen(tok_dir)
    if bpe is not None:
        encoders["bpe-qwen"] = bpe
    texts = {
        "ascii 800": filler(tok, 800, 3),
        "ascii 8000": filler(tok, 8000, 4),
        "mixed 800": MIXED * 22,
        "mixed 8000": MIXED * 220,
    }
    print(f"Qwen3 tokenizer ({len(tok)} ids); median us per call over {args.repeats} calls")
    names = " ".join(f"{name:>11s}" for name in encoders)
    print(f"{'text':12s} {'tokens':>6s} {names}   speed-up vs HF / vs fastokens")
    for label, text in texts.items():
        ref = reference(text)
        cells, ratios = [], []
        us = {}
        for name, fn in encoders.items():
            if name == "bpe-qwen" and not text.isascii():
                cells.append(f"{'(HF: n/a)':>11s}")  # bpe-qwen 0.1.5 split non-ASCII unlike HF
                continue
            assert fn(text) == ref, f"{name} differs from HF on {label}"
            us[name] = median_us(fn, text, args.repeats)
            cells.append(f"{us[name]:11.1f}")
        for name, v in us.items():
            if name != "tokenizers":
                ratios.append(f"{name} {us['tokenizers'] / v:.1f}x / {us['fastokens'] / v:.2f}x")
        print(f"{label:12s} {len(ref):6d} " + " ".join(cells) + "   " + "; ".join(ratios))


if __name__ == "__main__":
    main()
