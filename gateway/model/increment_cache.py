"""Increments without Jinja: the template's text around new messages, kept per shape.

An agent's turns repeat a few shapes: after the same last user message, one tool result (or a
few) with new text each time. Whenever the template does nothing with a new message's text but
write it out, the increment for that shape is the same text around the new values, and filling
that skeleton costs microseconds where a Jinja render costs hundreds (most of it, in a busy
gateway, waiting on memory: a render touches a lot of cold Python objects). Per shape, the
skeleton is used only after every check below passed:

- The increment is rendered with every string field of the new messages except `role` replaced
  by a placeholder: a `str` subclass that stops the render (`ValueRead`) at any use of its value
  other than being written out (a comparison, truth or length, a method such as `startswith` or
  `strip`, indexing, iteration, a number conversion, HTML escaping), in a copy of the template
  whose filters and tests refuse placeholders too (`guarded_template`: filters read their
  argument in C, where no method of it sees). Templates branch on roles, so roles stay real
  and are part of the shape; so are non-string fields (tool calls) and the rest of what the
  render depends on (the anchor, the tools when the increment carries them, the kwargs, whether
  the previous turn ended with its stop token).
- It is rendered again with placeholders of other lengths, words and lines: a value derived from
  the text some other way differs between the two.
- Each placeholder holds a quote, a newline, `<` and `&`: any escaping changes it, and the
  marker they share must only appear as whole placeholders.
- On first use, the filled skeleton must equal the real render of the same messages, and again
  on every `verify_every`-th fill after that: a template that reads the text in a way none of
  the above sees (a copy made in C, `([content] | join).startswith(...)`) is caught there, and
  logged. One fill in a thousand: a check costs a render, and one in 64 put renders into the
  p99 turn.

A shape that fails a check is rendered through Jinja from then on.
"""

from __future__ import annotations

import functools
import itertools
import logging
import re
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jinja2
import orjson

from rlgw.gateway.errors import GatewayError

logger = logging.getLogger(__name__)

_MARK = "rlgw" + secrets.token_hex(6)
# Two placeholder spellings: different lengths, word counts and lines, same marker.
_SPELLINGS = ('<{m}:{i}" \n&>', '<{m}:{i}"  two words\n\nand lines &>')
_PATTERNS = tuple(re.compile(re.escape(s.format(m=_MARK, i="@")).replace("@", r"(\d+)")) for s in _SPELLINGS)


class ValueRead(Exception):
    """A placeholder render read a value it should only have written out: the shape is not filled."""


class _Slot(str):
    """A placeholder value: writing it out passes; anything else raises `ValueRead`."""


def _reading(name: str) -> Callable[..., Any]:
    def read(self: _Slot, *args: Any, **kwargs: Any) -> Any:
        raise ValueRead(name)

    return read


# Every public str method and every operator that reads the value. `str()`, `format()` and
# `join` only copy it into the output, which is what a placeholder is for; a sum is still the
# value (`'' + content` then `startswith`), so it stays a placeholder.
for _name in [n for n in dir(str) if not n.startswith("_")] + [
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__len__", "__iter__",
    "__getitem__", "__contains__", "__mul__", "__rmul__", "__mod__", "__rmod__", "__repr__",
    "__bool__", "__int__", "__float__", "__html__", "__format__",
]:  # fmt: skip
    setattr(_Slot, _name, _reading(_name))
_Slot.__add__ = lambda self, other: _Slot(str.__add__(self, other))  # type: ignore[method-assign]
_Slot.__radd__ = lambda self, other: _Slot(other + str(self))  # type: ignore[attr-defined]

# Filters and tests that only hand a value on to be written out, or look at its type.
_PASSING = frozenset(
    {"filter string", "filter safe", "test string", "test defined", "test undefined", "test none"}
)


def _guarded(kind: str, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)  # keeps `jinja_pass_arg` (context-taking filters)
    def call(*args: Any, **kwargs: Any) -> Any:
        if any(type(a) is _Slot for a in (*args, *kwargs.values())):
            raise ValueRead(f"{kind} {name}")
        return function(*args, **kwargs)

    return call


def _holds_slot(value: Any) -> bool:
    return type(value) is _Slot or (isinstance(value, tuple | list) and any(type(v) is _Slot for v in value))


def _binop(context: Any, operator: str, left: Any, right: Any) -> Any:
    # `"%-30s" % content` pads by the value's length, read in C.
    if _holds_slot(left) or _holds_slot(right):
        raise ValueRead(f"operator {operator}")
    return left % right  # the only operator intercepted, computed as the plain template computes it


def _join(parts: Any) -> str:
    # `~`: a join holding a value is still the value (`(content ~ '').startswith(...)`).
    items = list(parts)
    text = "".join(map(str, items))
    return _Slot(text) if any(type(i) is _Slot for i in items) else text


def guarded_template(environment: jinja2.Environment, source: str) -> jinja2.Template:
    """`source` compiled in an overlay of `environment` where placeholders are refused by every
    filter and test but those in `_PASSING` (filters read their argument in C, where no method of
    it sees: `int`, `wordcount`, `tojson`, `length`) and by `%`, and stay placeholders through `~`."""
    overlay = environment.overlay()
    overlay.filters = {
        k: f if f"filter {k}" in _PASSING else _guarded("filter", k, f)
        for k, f in environment.filters.items()
    }
    overlay.tests = {
        k: f if f"test {k}" in _PASSING else _guarded("test", k, f) for k, f in environment.tests.items()
    }
    overlay.intercepted_binops = frozenset({"%"})
    overlay.call_binop = _binop  # type: ignore[method-assign]  # what the compiled code calls for `%`
    template = overlay.from_string(source)
    template.root_render_func.__globals__["str_join"] = _join  # what the compiled code calls for `~`
    return template


@dataclass(frozen=True, slots=True)
class Skeleton:
    """An increment's text as literal pieces around slots: pieces[0] + value + pieces[1] + ..."""

    pieces: tuple[str, ...]
    slots: tuple[int, ...]  # which value goes after each piece but the last

    def fill(self, values: list[str]) -> str:
        """The increment's text for these values."""
        out = [self.pieces[0]]
        for slot, piece in zip(self.slots, self.pieces[1:], strict=True):
            out.append(values[slot])
            out.append(piece)
        return "".join(out)


def _is_value(key: str, value: Any) -> bool:
    """Whether a message field is a value the skeleton leaves out (roles stay: templates branch on them)."""
    return key != "role" and type(value) is str


def shape(messages: list[dict[str, Any]]) -> tuple[bytes, list[str]]:
    """The shape of normalized messages (roles, keys, non-string values) and their string values."""
    values: list[str] = []
    parts: list[Any] = []
    for m in messages:
        fixed: dict[str, Any] = {}
        for k, v in m.items():
            if _is_value(k, v):
                fixed[k] = len(values)
                values.append(v)
            else:
                fixed[k] = v
        parts.append(fixed)
    return orjson.dumps(parts), values


def _placeholders(messages: list[dict[str, Any]], spelling: str) -> list[dict[str, Any]]:
    """`messages` with each value replaced by its placeholder, numbered in `shape`'s order."""
    n = itertools.count()
    return [
        {k: _Slot(spelling.format(m=_MARK, i=next(n))) if _is_value(k, v) else v for k, v in m.items()}
        for m in messages
    ]


def _split(text: str, pattern: re.Pattern[str]) -> Skeleton | None:
    parts = pattern.split(text)  # text, slot, text, slot, ..., text
    pieces, slots = tuple(parts[0::2]), tuple(int(i) for i in parts[1::2])
    if any(_MARK in p for p in pieces):
        return None  # a placeholder was written out changed (escaped, cut, repeated in part)
    return Skeleton(pieces, slots)


def build_skeleton(
    render: Callable[[list[dict[str, Any]]], str], messages: list[dict[str, Any]]
) -> Skeleton | None:
    """The skeleton of `render(messages)` if the checks in the module docstring pass, else None."""
    found = []
    for spelling, pattern in zip(_SPELLINGS, _PATTERNS, strict=True):
        try:
            text = render(_placeholders(messages, spelling))
        except (ValueRead, GatewayError):
            return None
        except Exception as e:  # the real render succeeded: a failing copy only costs the cache
            logger.warning(
                "increment placeholder render failed (%s: %s); rendering this shape", type(e).__name__, e
            )
            return None
        found.append(_split(text, pattern))
    return found[0] if found[0] is not None and found[0] == found[1] else None


class IncrementCache:
    """Skeletons by (context, shape), least recently used dropped past `size`; None marks a shape
    that failed a check and is always rendered."""

    def __init__(self, size: int = 4096, verify_every: int = 1000) -> None:
        self._size = size
        self._verify_every = verify_every
        self._fills = 0
        self._skeletons: OrderedDict[tuple[Any, bytes], Skeleton | None] = OrderedDict()

    def text(
        self,
        context: Any,
        messages: list[dict[str, Any]],
        render: Callable[[list[dict[str, Any]]], str],
        render_placeholders: Callable[[list[dict[str, Any]]], str] | None = None,
    ) -> str:
        """`render(messages)`, from the skeleton of their shape in `context` when it has one.

        `context` holds everything else the render depends on (hashable). A miss renders for
        real, builds the skeleton (with `render_placeholders`, default `render`: a render that
        hands the template the placeholders themselves, not copies) and keeps it only if it
        reproduces that render exactly.
        """
        key_shape, values = shape(messages)
        key = (context, key_shape)
        skeleton = self._skeletons.get(key, _MISSING)
        if skeleton is _MISSING:
            text = render(messages)
            built = build_skeleton(render_placeholders or render, messages)
            self._skeletons[key] = built if built is not None and built.fill(values) == text else None
            if len(self._skeletons) > self._size:
                self._skeletons.popitem(last=False)
            return text
        self._skeletons.move_to_end(key)
        if skeleton is None:
            return render(messages)
        self._fills += 1
        if self._fills % self._verify_every:
            return skeleton.fill(values)
        text = render(messages)
        if skeleton.fill(values) != text:
            logger.error(
                "increment skeleton differs from the template's render; rendering this shape from now on"
            )
            self._skeletons[key] = None
        return text

    def __len__(self) -> int:
        return len(self._skeletons)

    def usable(self) -> int:
        """How many kept shapes are filled rather than rendered."""
        return sum(s is not None for s in self._skeletons.values())


_MISSING: Any = object()
