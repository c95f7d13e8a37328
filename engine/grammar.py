"""Constrained decoding with xgrammar: SGLang's `json_schema`, `regex`, `ebnf` and `structural_tag`.

Owns compiling a request's constraint into an xgrammar grammar (against the tokenizer's real
vocabulary: ids the model pads beyond it are never allowed), one matcher per request, and masking a
batch's logits with the matchers' token bitmasks. Follows SGLang's xgrammar backend: the model's
EOS ids are the grammar's stop tokens (a request finishes when its matcher terminates on one),
`json_schema` "$$ANY$$" is any JSON value, and a constraint that does not compile fails its request
with "Failed to compile <json|regex|ebnf|structural_tag> grammar: ...". One difference: JSON
whitespace between tokens is free in kind (SGLang's `any_whitespace`) but at most
`MAX_JSON_WHITESPACE` characters per gap, because a policy that keeps sampling whitespace (small and
random models do) would otherwise spend the whole budget inside a valid-but-endless JSON prefix.
Knows nothing about queues or HTTP; the runner calls `mask` before sampling and `Matcher.accept`
after. xgrammar is imported on the first constrained request (it costs seconds to import).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

import orjson
import torch

from rlgw.engine.errors import GrammarError
from rlgw.engine.sampling import SamplingParams

# xgrammar's C++ errors read "[time] file.cc:line: Check failed: (...) is false: <the gist>".
_CPP_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*(Check failed: .*? is false: )?")
ANY_JSON = "$$ANY$$"  # SGLang's json_schema for "any JSON" (OpenAI's json_object)
MAX_JSON_WHITESPACE = 32  # characters between two JSON tokens: room for indentation 16 levels deep


@dataclass(slots=True, frozen=True)
class Constraint:
    """Which constraint a request carries: SGLang's dispatch key and its source text."""

    kind: str  # "json", "regex", "ebnf" or "structural_tag" (SGLang's names in its messages)
    source: str


def constraint_of(params: SamplingParams) -> Constraint | None:
    """The request's constraint, by SGLang's priority (json_schema, regex, ebnf, structural_tag)."""
    for kind, source in (
        ("json", params.json_schema),
        ("regex", params.regex),
        ("ebnf", params.ebnf),
        ("structural_tag", params.structural_tag),
    ):
        if source is not None:
            return Constraint(kind, source)
    return None


class Matcher:
    """One request's position in its grammar."""

    __slots__ = ("_m",)

    def __init__(self, matcher) -> None:
        self._m = matcher

    def accept(self, token: int) -> bool:
        """Advance by `token`; False if the grammar does not allow it (the matcher is unchanged)."""
        return bool(self._m.accept_token(token))

    @property
    def terminated(self) -> bool:
        """True once the grammar is complete and a stop token was accepted."""
        return bool(self._m.is_terminated())

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into row `row` of `bitmask`."""
        self._m.fill_next_token_bitmask(bitmask, row)


class Grammars:
    """Compiles constraints for one tokenizer and masks logits; thread-safe, compiled grammars cached."""

    def __init__(self, tokenizer, vocab_size: int, stop_ids: list[int]) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._stop_ids = stop_ids
        self._compiler = None
        self._lock = threading.Lock()

    def _get_compiler(self):
        with self._lock:
            if self._compiler is None:
                import xgrammar as xgr

                info = xgr.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self._vocab_size, stop_token_ids=self._stop_ids
                )
                self._compiler = xgr.GrammarCompiler(info)  # caches compiled grammars by source
            return self._compiler

    def matcher(self, c: Constraint) -> Matcher:
        """A fresh matcher for `c`; `GrammarError` (SGLang's message) if it does not compile."""
        import xgrammar as xgr

        compiler = self._get_compiler()
        try:
            if c.kind == "json":
                # The empty schema is any JSON value (xgrammar's builtin JSON grammar, with the cap).
                compiled = compiler.compile_json_schema(
                    "{}" if c.source == ANY_JSON else c.source,
                    any_whitespace=True,
                    max_whitespace_cnt=MAX_JSON_WHITESPACE,
                )
            elif c.kind == "regex":
                compiled = compiler.compile_regex(c.source)
            elif c.kind == "ebnf":
                compiled = compiler.compile_grammar(c.source)
            else:
                compiled = _compile_structural_tag(compiler, c.source)
        except (RuntimeError, ValueError, TypeError, KeyError) as exc:
            raise GrammarError(f"Failed to compile {c.kind} grammar: {_first_line(exc)}") from exc
        return Matcher(xgr.GrammarMatcher(compiled))

    def mask(self, logits: torch.Tensor, matchers: list[Matcher | None]) -> None:
        """Set to -inf, in place, every logit a row's grammar does not allow (rows without one untouched)."""
        rows = [i for i, m in enumerate(matchers) if m is not None]
        if not rows:
            return
        import xgrammar as xgr

        bitmask = xgr.allocate_token_bitmask(len(matchers), logits.shape[-1])
        for i in rows:
            matchers[i].fill(bitmask, i)
        xgr.apply_token_bitmask_inplace(logits, bitmask, indices=rows)


def _compile_structural_tag(compiler, source: str):
    """SGLang's two structural-tag shapes: `{"format": ...}` (xgrammar's), or the legacy
    `{"structures": [{"begin", "schema", "end"}], "triggers": [...]}`."""
    import xgrammar as xgr

    tag = orjson.loads(source)
    if not (isinstance(tag, dict) and "structures" in tag and "triggers" in tag):
        return compiler.compile_structural_tag(source)
    items = [
        xgr.StructuralTagItem(
            begin=s["begin"], schema=orjson.dumps(s.get("schema") or {}).decode(), end=s["end"]
        )
        for s in tag["structures"]
    ]
    return compiler.compile_structural_tag(items, tag["triggers"])


def _first_line(exc: Exception) -> str:
    """The gist of an xgrammar error: its first line without the C++ `[time] file.cc:line:` prefix."""
    lines = str(exc).strip().splitlines()
    return _CPP_PREFIX.sub("", lines[0]) if lines else type(exc).__name__
