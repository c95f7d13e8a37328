"""The one parser per generation: decoded text in, content / reasoning / tool-call events out.

The gateway feeds the incrementally decoded text of one generation to one `OutputParser`, for
streamed and non-streamed responses alike, so both agree by construction: the concatenation of
the streamed ``content`` and ``reasoning`` events equals `result().content` and
`result().reasoning_content`, and the ``tool_call`` events are `result().tool_calls`, whatever
the chunking.

Streaming: text streams as soon as it cannot be the start of a marker (``<think>``,
``</think>``, ``<tool_call>``, ``</tool_call>``). Only a possible partial marker at the end of the
buffer is held back, and, when a parser is active, trailing whitespace (see below). A
``<tool_call>`` block in a JSON format (hermes, qwen25) whose head reads ``{"name": "NAME",
"arguments": {`` with NAME one of the tools streams as it is sampled, as OpenAI's and vLLM's
servers stream calls: ``tool_call_start`` (the name), then ``tool_call_args`` pieces of the
arguments text exactly as the model writes it, up to the object's closing brace; that text is
the call's `arguments`, and a block that then does not parse to exactly that call keeps the
call and records ``streamed_call_mismatch``. That holds for a generation that ends inside the
arguments object too (a stop token or the length limit before its closing brace): the agent was
already sent the call, will run or refuse it and echo it back by its id, so it stays the call,
its arguments the unfinished text the model wrote, and nothing of it is sent again as content
(the gateway once turned it into content, so the agent held a call the ledger had not minted and
its echo split the sample; seen with Claude Code). Any other block is buffered until it closes and
then parsed (`tool_calls.parse_block`): a valid block gives one ``tool_call`` event per call;
an invalid one goes out whole as ``content`` and a `ParseError` is recorded. Each character is
scanned a bounded number of times (a scan position and a short carry, never the whole buffer).

Whitespace: when reasoning or tool parsing is active, ``reasoning_content`` and ``content`` are
stripped at both ends (SGLang strips ``normal_text`` in its one-shot parse: Qwen's ``\\n\\n`` after
``</think>``, the ``\\n`` before and between calls). Inner whitespace is kept, so text written after
a tool call stays content (SGLang's one-shot qwen25 parse drops it; its streaming parse sends it,
and we never drop model output quietly). With no parser active the text is passed through verbatim.

This module knows nothing about tokens, HTTP or the OpenAI chunk shapes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Literal

from rlgw.gateway.parsing.reasoning import THINK_END, THINK_START
from rlgw.gateway.parsing.tool_calls import (
    INVALID_JSON,
    STREAMED_MISMATCH,
    TOOL_CALL_END,
    TOOL_CALL_START,
    ParseError,
    ToolCall,
    normalize_tool_format,
    parse_block,
    tool_schemas,
)

__all__ = ["OutputParser", "ParseError", "ParsedOutput", "ParserEvent", "ToolCall"]


@dataclass(slots=True)
class ParserEvent:
    """Something ready to stream: a piece of content or reasoning text, one whole tool call, or
    a call streamed as it is sampled (`tool_call_start` with its name, then `tool_call_args`
    pieces of its arguments; such a call has no `tool_call` event)."""

    kind: Literal["content", "reasoning", "tool_call", "tool_call_start", "tool_call_args"]
    text: str = ""
    call: ToolCall | None = None


# The head of a JSON call whose arguments are an object: `{"name": "NAME", "arguments": {`.
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')
_HEAD_LIMIT = 512  # a block whose head is not recognized by then is parsed whole, at its end
_JSON_FORMATS = frozenset({"hermes", "qwen25"})


@dataclass(slots=True)
class _ArgStream:
    """A call whose arguments stream as they are sampled: its index and name, the arguments
    text so far, and a small JSON scanner that stops at the object's closing brace."""

    index: int
    name: str
    parts: list[str] = field(default_factory=list)
    depth: int = 0
    in_string: bool = False
    escape: bool = False
    done: bool = False

    def take(self, text: str) -> str:
        """The part of `text` that belongs to the arguments object (nothing after its end)."""
        if self.done:
            return ""
        for i, ch in enumerate(text):
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.done = True
                    text = text[: i + 1]
                    break
        self.parts.append(text)
        return text


@dataclass(slots=True)
class ParsedOutput:
    """The whole parse of one generation; `reasoning_content` is None when empty."""

    content: str
    reasoning_content: str | None
    tool_calls: list[ToolCall]
    errors: list[ParseError]


class _Channel:
    """Accumulates one text stream (content or reasoning), optionally stripping its two ends.

    Stripping streams: leading whitespace is dropped, trailing whitespace is held until
    non-whitespace follows (then sent with it) or the channel ends (then dropped).
    """

    __slots__ = ("held", "kind", "parts", "started", "strip")

    def __init__(self, kind: Literal["content", "reasoning"], strip: bool) -> None:
        self.kind = kind
        self.strip = strip
        self.parts: list[str] = []
        self.started = False
        self.held = ""

    def push(self, text: str, out: list[ParserEvent]) -> None:
        if not text:
            return
        if self.strip:
            if not self.started:
                text = text.lstrip()
                if not text:
                    return
                self.started = True
            body = text.rstrip()
            if not body:
                self.held += text
                return
            text, self.held = self.held + body, text[len(body) :]
        self.parts.append(text)
        if out and out[-1].kind == self.kind:
            out[-1].text += text
        else:
            out.append(ParserEvent(self.kind, text))

    def end(self) -> None:
        self.held = ""


_START, _REASONING, _CONTENT, _TOOL = range(4)


def _partial_marker_len(s: str, lo: int, markers: tuple[str, ...], longest: int) -> int:
    """Length of the longest suffix of s[lo:] that is a proper prefix of one of `markers`.

    `longest` is the length of the longest marker.
    """
    # Markers hold '<' only at position 0, so only the suffix from the last '<' can qualify.
    i = s.rfind("<", max(lo, len(s) - longest + 1))
    if i < 0:
        return 0
    tail = s[i:]
    return len(tail) if any(m.startswith(tail) and m != tail for m in markers) else 0


class OutputParser:
    """Splits one generation's text into reasoning, content and tool calls, incrementally.

    - `tool_format`: ``hermes`` | ``qwen25`` (``qwen``) | ``qwen3_coder`` | None. With None or no
      `tools`, ``<tool_call>`` is plain content (the gateway passes None for ``tool_choice="none"``).
    - `reasoning`: parse ``<think>...</think>`` (Qwen3); `reasoning_forced`: the prompt already
      opened the think block, so the output starts in reasoning.

    Use: `feed` each decoded piece and stream the events it returns, `close` at the end of the
    generation (it flushes held text and settles an unterminated block), then `result`.
    """

    def __init__(
        self,
        *,
        tool_format: str | None,
        tools: list[dict] | None,
        reasoning: bool,
        reasoning_forced: bool,
    ) -> None:
        fmt = normalize_tool_format(tool_format)
        self._schemas = tool_schemas(tools)
        self._fmt = fmt if fmt and tools else ""  # "": <tool_call> is plain content
        self._reasoning_forced = reasoning and reasoning_forced
        strip = bool(reasoning or self._fmt)
        self._content = _Channel("content", strip)
        self._thinking = _Channel("reasoning", strip)
        tool = (TOOL_CALL_START,) if self._fmt else ()
        self._markers = {_REASONING: (THINK_END, *tool), _CONTENT: tool}
        self._longest = max(map(len, self._markers[_REASONING]))
        self._state = _START if reasoning else _CONTENT
        self._carry = ""  # text not yet resolved: a possible partial marker, or a block's tail
        self._block: list[str] = []  # text of the open <tool_call> block, before the carry
        self._calls: list[ToolCall] = []
        self._errors: list[ParseError] = []
        self._closed = False
        # The open block's call, once its head is recognized (JSON formats): it streams.
        self._head: str | None = ""  # None: this block's head is not one that streams
        self._arg: _ArgStream | None = None
        self._streams = self._fmt in _JSON_FORMATS
        self._lead_seen = False  # the open block's first non-space character was seen

    def feed(self, text: str) -> list[ParserEvent]:
        """Consume the next piece of decoded text; return the events that can be sent now."""
        if self._closed:
            raise RuntimeError("OutputParser.feed() after close()")
        out: list[ParserEvent] = []
        if text:
            self._scan(self._carry + text, out)
        return out

    def close(self) -> list[ParserEvent]:
        """End of generation: flush held text, settle an unterminated block; return the last events."""
        if self._closed:
            raise RuntimeError("OutputParser.close() called twice")
        self._closed = True
        out: list[ParserEvent] = []
        carry, self._carry = self._carry, ""
        if self._state == _TOOL:
            self._stream(carry, out)
            self._finish_block("".join(self._block) + carry, terminated=False, out=out)
        elif self._state == _REASONING or (self._state == _START and self._reasoning_forced):
            self._thinking.push(carry, out)
        else:
            self._content.push(carry, out)
        self._thinking.end()
        self._content.end()
        return out

    def result(self) -> ParsedOutput:
        """The whole parse; only after `close`."""
        if not self._closed:
            raise RuntimeError("OutputParser.result() before close()")
        return ParsedOutput(
            content="".join(self._content.parts),
            reasoning_content="".join(self._thinking.parts) or None,
            tool_calls=list(self._calls),
            errors=list(self._errors),
        )

    def _scan(self, s: str, out: list[ParserEvent]) -> None:
        """Run the state machine over `s` (the carry plus new text), leaving a new carry."""
        pos = 0
        n = len(s)
        while pos < n:
            state = self._state
            if state == _START:
                rest = s[pos:].lstrip()
                if rest.startswith(THINK_START):
                    pos = n - len(rest) + len(THINK_START)
                    self._state = _REASONING
                elif THINK_START.startswith(rest):  # empty, or a partial "<think>": wait
                    self._carry = s[pos:]
                    return
                else:
                    self._state = _REASONING if self._reasoning_forced else _CONTENT
            elif state == _TOOL:
                if self._streams and not self._lead_seen and (lead := s[pos:].lstrip()):
                    self._lead_seen = True
                    if lead[0] not in "{[":
                        pos = self._release_block(s, pos, out)
                        continue
                end = s.find(TOOL_CALL_END, pos)
                if end < 0:
                    # The end marker can only straddle the last len-1 characters.
                    keep = max(pos, n - len(TOOL_CALL_END) + 1)
                    self._block.append(s[pos:keep])
                    self._stream(s[pos:keep], out)
                    self._carry = s[keep:]
                    return
                self._stream(s[pos:end], out)
                block = "".join(self._block) + s[pos:end]
                self._block.clear()
                pos = end + len(TOOL_CALL_END)
                self._state = _CONTENT
                self._finish_block(block, terminated=True, out=out)
            else:
                channel = self._thinking if state == _REASONING else self._content
                markers = self._markers[state]
                hit, marker = -1, ""
                for m in markers:
                    i = s.find(m, pos)
                    if i >= 0 and (hit < 0 or i < hit):
                        hit, marker = i, m
                if hit < 0:
                    hold = _partial_marker_len(s, pos, markers, self._longest) if markers else 0
                    channel.push(s[pos : n - hold], out)
                    self._carry = s[n - hold :]
                    return
                channel.push(s[pos:hit], out)
                pos = hit + len(marker)
                if state == _REASONING:
                    self._thinking.end()
                self._state = _TOOL if marker == TOOL_CALL_START else _CONTENT
        self._carry = ""

    def _release_block(self, s: str, pos: int, out: list[ParserEvent]) -> int:
        """A JSON-format block that opens with neither `{` nor `[` is no call: it goes out as
        content at once (not held to its end, which may never come) and is flagged."""
        seen = TOOL_CALL_START + "".join(self._block)
        self._block.clear()
        end = s.find(TOOL_CALL_END, pos)
        raw = seen + (s[pos : end + len(TOOL_CALL_END)] if end >= 0 else s[pos:])  # as much as is known
        self._errors.append(ParseError(INVALID_JSON, "the block opens with no JSON object or list", raw))
        self._content.push(seen, out)
        self._state, self._lead_seen = _CONTENT, False
        return pos

    def _stream(self, piece: str, out: list[ParserEvent]) -> None:
        """Stream the open block's call as it is sampled: its name once the head `{"name":
        "NAME", "arguments": {` is seen (NAME one of the tools), then its arguments text."""
        if not self._streams or not piece:
            return
        if self._arg is None:
            if self._head is None:  # not a streamable head: parsed whole at the block's end
                return
            self._head += piece
            m = _HEAD.match(self._head)
            if m is None:
                if len(self._head) > _HEAD_LIMIT:
                    self._head = None
                return
            if m[1] not in self._schemas:
                self._head = None  # an unknown tool's call is parsed (and flagged) whole
                return
            self._arg = _ArgStream(len(self._calls), m[1])
            out.append(ParserEvent("tool_call_start", call=ToolCall(self._arg.index, m[1], "")))
            piece = self._head[m.end() :]
        if text := self._arg.take(piece):
            out.append(
                ParserEvent("tool_call_args", text=text, call=ToolCall(self._arg.index, self._arg.name, ""))
            )

    def _finish_block(self, block: str, *, terminated: bool, out: list[ParserEvent]) -> None:
        """Turn one block into tool-call events, or into content plus a recorded error."""
        parsed = parse_block(self._fmt, block, self._schemas, terminated=terminated)
        self._errors.extend(parsed.errors)
        arg, self._arg, self._head, self._lead_seen = self._arg, None, "", False
        if arg is not None:
            # The call went out as it was sampled: it stays a call, with the arguments text the
            # model wrote (what the agent was streamed); a block that does not parse to exactly
            # that call is flagged.
            raw = "".join(arg.parts)
            if not arg.done:
                detail = "generation ended inside the arguments of a call already streamed"
                self._errors.append(ParseError(STREAMED_MISMATCH, detail, TOOL_CALL_START + block))
            elif not (parsed.ok and len(parsed.calls) == 1 and _same_object(raw, parsed.calls[0][1])):
                detail = "the block is not the one call whose name and arguments were streamed"
                self._errors.append(ParseError(STREAMED_MISMATCH, detail, TOOL_CALL_START + block))
            self._calls.append(ToolCall(arg.index, arg.name, raw))
            return
        if not parsed.ok:
            self._content.push(parsed.errors[0].raw if parsed.errors else block, out)
            return
        for name, arguments in parsed.calls:
            call = ToolCall(len(self._calls), name, arguments)
            self._calls.append(call)
            out.append(ParserEvent("tool_call", call=call))


def _same_object(raw: str, arguments: str) -> bool:
    """Whether the streamed arguments text is the parsed arguments object."""
    try:
        return json.loads(raw) == json.loads(arguments)
    except ValueError:
        return False
