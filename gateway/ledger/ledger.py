"""The token ledger of one session: what the model was fed and what it sampled, token for token.

Per segment the ledger keeps compact arrays — token ids (int32), logprobs (float32), loss mask
(uint8) — plus the weight version of every generated token, the signatures of the messages it
has consumed, and the turns it generated (keyed by the response and tool-call ids it minted).

Sync rule: the agent resends its whole history each turn. Messages already consumed must come
back unchanged (same signature: what the template renders from them, not their JSON spelling),
and the assistant turns the gateway generated must come back matched by their tool-call ids
(or, for plain answers, their content): their *sampled* tokens stay in the ledger, so
re-serialized arguments or stripped reasoning are not differences. Only the messages after the
consumed prefix are new. A shrunk or rewritten prefix, a changed tool list, or a switch between
chat and completions is a `Violation` with a machine-readable `cause`, handled by the session's
policy (a new segment, passthrough, or refusal).

Conversations: a session may hold more than one line of turns (a main agent and its subagents, a
title or memory side call). Each segment belongs to one conversation, and each conversation appends
to its own latest segment. A request continues the conversation whose consumed history it extends
(`match`: the conversation that spoke last is tried first, then the others, newest first); one that
extends none opens a new conversation (cause `new_conversation`) when its opening (its leading system
message, or that it has none) is no conversation's, or when the agent says so (`X-Rlgw-Event:
new_conversation`); otherwise it is a rewrite of the conversation with that opening it shares the
longest prefix with, and the policy decides as above (a compaction keeps the system prompt; a title
call, a memory or a Task subagent brings its own).
A new conversation's parent is the conversation that spoke last (or the one the agent names).

Echo rules (what a generated turn may come back as and still keep its sampled tokens):
- with `tool_calls` carrying exactly the ids minted for that turn (order free);
- with `tool_calls` carrying no ids at all (Gemini's `functionCall` parts need none) whose names
  and arguments (as JSON values) are exactly the calls served in that turn (order free): recorded
  as `echo_matches` (`calls`);
- as plain text with no `tool_calls` whose content names exactly the minted ids of that turn
  and no other minted id (agents such as smolagents echo calls as `Calling tools: [...]`):
  recorded in the sample's metadata as `echo_matches`;
- for a turn without calls, with the same content (whitespace at the ends ignored).
A matched echo whose arguments, names or content differ from what was sampled keeps the sampled
tokens (they are what the model produced) and is recorded as `echo_edits` (turn, field).

Appending is atomic per turn: the prompt increment and the sampled ids are committed together,
after the engine answered, so a failed or aborted turn leaves the ledger as it was. `sync` never
changes the ledger; segment changes a policy decides are applied by the caller at commit time.

This module knows nothing about HTTP, templates or the engine's wire format.
"""

from __future__ import annotations

import enum
import functools
import re
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import xxhash

from rlgw.gateway.content import content_text
from rlgw.gateway.sample import Sample, SampleStatus, VersionSpan


class Policy(enum.StrEnum):
    """What to do when the agent shrinks or rewrites history it already sent."""

    SEGMENT = "segment"  # close the segment (it becomes its own sample) and start a new one
    PASSTHROUGH = "passthrough"  # stop capturing; serve the rest; the session's samples are invalid
    REFUSE = "refuse"  # answer 409 and change nothing


class Cause(enum.StrEnum):
    """Why a segment was opened: the machine-readable vocabulary of segment causes.

    An agent may also state its own cause (`X-Rlgw-Event: compaction`); that text is used as is.
    """

    START = "start"  # the session's first segment
    TRUNCATION = "truncation"  # the history shrank
    REWRITE = "rewrite"  # a consumed message changed
    TOOLS_CHANGED = "tools_changed"  # the tool list changed
    MODE_SWITCH = "mode_switch"  # chat <-> completions, or another API surface
    TEMPLATE_DRIFT = "template_drift"  # the template's render of the history changed
    RETRY = "retry"  # a client retry the policy did not fold into the last turn
    CONCURRENT = "concurrent"  # a duplicate request that overlapped the turn it repeats
    NEW_CONVERSATION = "new_conversation"  # the first segment of a conversation other than the first


@dataclass(frozen=True, slots=True)
class Violation:
    """The incoming history is not an extension of what the ledger consumed."""

    cause: str  # a `Cause` value
    index: int  # first message that differs (or the new length, for a truncation)
    detail: str

    def __str__(self) -> str:
        return self.detail


@dataclass(slots=True)
class Synced:
    """What `sync` found: the new messages, and how echoed generated turns were matched."""

    new: list[dict[str, Any]]
    # (turn index, how) for echoes matched by something other than tool_calls ids / content.
    echo_matches: list[tuple[int, str]] = field(default_factory=list)
    # (turn index, field) where an echoed generated turn differs from what was sampled.
    echo_edits: list[tuple[int, str]] = field(default_factory=list)
    # The request's `history_print`: what the turn leaves for the next one's fast check.
    history: tuple[int, int, int] | None = None


@dataclass(slots=True)
class Match:
    """Which conversation a request continues (`Ledger.match`), and what syncing with it found.

    `opens`: the request extends no conversation and opens a new one (`found` is then a
    `Violation` with cause `new_conversation`, and `conversation` the index it will get).
    """

    conversation: int
    found: Synced | Violation
    opens: bool = False


@dataclass(slots=True)
class Conversation:
    """One line of turns in a session (a main agent, a subagent, a side call): its segments."""

    index: int
    parent: int | None  # the conversation it was opened from (None: the session's first)
    segments: list[int]  # indices into `Ledger.segments`, oldest first; turns append to the last


@dataclass(slots=True)
class GeneratedTurn:
    """An assistant turn the engine sampled: ids[start:end] in its segment.

    `prompt_start` is where the turn's prompt increment begins and `records_before` how many
    messages were consumed before it: together they let a retried turn be rolled back.
    """

    prompt_start: int
    records_before: int
    versions_before: int
    start: int
    end: int
    response_id: str
    tool_call_ids: tuple[str, ...]
    content: str
    rid: str
    finish_type: str
    ended_with_stop_token: bool
    parse_errors: list[dict[str, Any]]
    # What the agent was served: (name, canonical arguments) per minted call, in order.
    calls: tuple[tuple[str, str], ...] = ()
    committed_at: float = 0.0  # time.monotonic() at commit (retry vs concurrent duplicate)


@dataclass(slots=True)
class _Record:
    """One consumed message: its digest, or the generated turn it corresponds to."""

    role: str
    digest: int
    turn: int  # index into Segment.turns, or -1 for messages the agent supplied


_MINTED_ID = re.compile(r"call_[0-9a-f]{24}")


def canonical_arguments(arguments: Any) -> str:
    """Tool-call arguments in one spelling (a JSON object string re-encoded with sorted keys)."""
    if isinstance(arguments, str):
        # Agents resend every past call each turn: short argument strings are decoded once.
        return _canonical_cached(arguments) if len(arguments) <= _CACHED_ARGUMENTS else _canonical(arguments)
    return orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()


def _canonical(arguments: str) -> str:
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


_CACHED_ARGUMENTS = 4096  # bytes: the cache holds at most 4096 strings of this size (16 MiB)
_canonical_cached = functools.lru_cache(maxsize=4096)(_canonical)


def message_digest(m: dict[str, Any]) -> int:
    """Signature of a message the agent supplied: what the template renders from it.

    Content is compared as text (a string and the same text as a list of text parts are the
    same message; `null` and "" too); keys with no value (None, "", []) are left out, so a
    client that adds `"name": null` on resend is not a rewrite; tool-call arguments are compared
    as JSON values, not spellings.
    """
    keep: dict[str, Any] = {"role": m.get("role"), "content": content_text(m.get("content"))}
    for k in ("name", "tool_call_id"):
        if m.get(k) not in (None, ""):
            keep[k] = m[k]
    calls = m.get("tool_calls")
    if calls:
        keep["tool_calls"] = [_call_key(c) for c in calls]
    return xxhash.xxh3_64_intdigest(orjson.dumps(keep, option=orjson.OPT_SORT_KEYS))


def _call_key(call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    fn = call.get("function") if isinstance(call.get("function"), dict) else {}
    return [call.get("id"), fn.get("name"), canonical_arguments(fn.get("arguments"))]


def history_print(messages: list[dict[str, Any]], raw: bytes | None = None) -> tuple[int, int, int]:
    """(message count, byte count, digest) of a request's messages as serialized (`raw`:
    `orjson.dumps(messages)`, if already made), without the closing bracket.

    The next request of a well-behaved agent starts with the same bytes: `Ledger.sync` then
    checks only what follows them, instead of every message again (the history grows each turn).
    """
    raw = orjson.dumps(messages) if raw is None else raw
    return len(messages), len(raw) - 1, xxhash.xxh3_64_intdigest(memoryview(raw)[:-1])


def _known_prefix(seg: Segment, messages: list[dict[str, Any]], raw: bytes) -> int:
    """How many leading messages are byte for byte those of the segment's last committed request
    (already checked then, and nothing in the records changed since): 0 if not all of them."""
    if seg.history is None:
        return 0
    n, size, digest = seg.history
    # The print describes the records but the last turn's own; a longer request follows it.
    if n != len(seg.records) - 1 or len(messages) <= n or len(raw) <= size or raw[size] != ord(","):
        return 0
    return n if xxhash.xxh3_64_intdigest(memoryview(raw)[:size]) == digest else 0


def tools_digest(tools: list[dict[str, Any]] | None) -> int:
    """Signature of a tool list: the same tools in any key order or whitespace are the same."""
    if not tools:
        return 0
    return xxhash.xxh3_64_intdigest(orjson.dumps(tools, option=orjson.OPT_SORT_KEYS))


def _match_turn(m: dict[str, Any], turn: GeneratedTurn) -> tuple[str, list[str]] | None:
    """How `m` echoes `turn` ("ids", "calls", "ids_in_text", "content"), with the fields it
    edited; None if not."""
    if m.get("role") != "assistant":
        return None
    calls = [tc for tc in (m.get("tool_calls") or []) if isinstance(tc, dict)]
    text = content_text(m.get("content"))
    if calls:
        if not any(tc.get("id") for tc in calls) and turn.calls:
            if sorted(map(_served, calls)) != sorted(turn.calls):
                return None
            return "calls", _edits(turn, [], text)
        if sorted(tc.get("id", "") for tc in calls) != sorted(turn.tool_call_ids):
            return None
        return "ids", _edits(turn, calls, text)
    if turn.tool_call_ids:
        # A text echo of a call turn: it must name exactly this turn's minted ids.
        if set(_MINTED_ID.findall(text)) == set(turn.tool_call_ids):
            return "ids_in_text", []
        return None
    if text.strip() == turn.content.strip():
        return "content", []
    return None


def _served(call: dict[str, Any]) -> tuple[str, str]:
    """A call as `GeneratedTurn.calls` keeps what was served: (name, canonical arguments)."""
    fn = call.get("function") if isinstance(call.get("function"), dict) else {}
    return str(fn.get("name") or ""), canonical_arguments(fn.get("arguments"))


def _edits(turn: GeneratedTurn, calls: list[dict[str, Any]], text: str) -> list[str]:
    edits = []
    if turn.content.strip() != text.strip():
        edits.append("content")
    served = dict(zip(turn.tool_call_ids, turn.calls, strict=False))
    for tc in calls:
        want = served.get(tc.get("id", ""))
        fn = tc.get("function") if isinstance(tc.get("function"), dict) else {}
        if want is None:
            continue
        if fn.get("name") != want[0]:
            edits.append("tool_calls.name")
        if canonical_arguments(fn.get("arguments")) != want[1]:
            edits.append("tool_calls.arguments")
    return sorted(set(edits))


@dataclass
class Segment:
    """One contiguous token series; becomes one training sample."""

    cause: str  # a `Cause` value, or the agent's own (X-Rlgw-Event)
    detail: str = ""  # the cause in words
    ids: array = field(default_factory=lambda: array("i"))
    logprobs: array = field(default_factory=lambda: array("f"))
    mask: bytearray = field(default_factory=bytearray)
    # (version, start, end) over absolute positions of generated tokens, merged when adjacent.
    versions: list[list[Any]] = field(default_factory=list)
    turns: list[GeneratedTurn] = field(default_factory=list)
    records: list[_Record] = field(default_factory=list)
    # `history_print` of the request of the last turn committed here (None: unknown).
    history: tuple[int, int, int] | None = None
    # /v1/completions only: the text the agent has seen (its prompts and our completions).
    text: str = ""
    surface: str | None = None  # the API surface of its turns (chat, completions, ...)
    tools: int = 0  # digest of the tool list its prompt rendered
    conversation: int = 0  # the index of the conversation it belongs to
    # Sample metadata gathered at commit: echo_matches, echo_edits, replaced_turns, agent_sampling.
    notes: dict[str, list[Any]] = field(default_factory=dict)

    def note(self, key: str, value: Any) -> None:
        """Add `value` to the metadata list `key` (once)."""
        items = self.notes.setdefault(key, [])
        if value not in items:
            items.append(value)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def last_turn(self) -> GeneratedTurn | None:
        """The most recent generated turn, if any."""
        return self.turns[-1] if self.turns else None

    def ids_view(self) -> np.ndarray:
        """The token ids as an int32 numpy view (no copy; do not hold it across a commit)."""
        return np.frombuffer(self.ids, dtype=np.int32) if len(self.ids) else np.zeros(0, dtype=np.int32)

    def trainable_tokens(self) -> int:
        """Number of mask-1 tokens."""
        return sum(t.end - t.start for t in self.turns)


@dataclass(slots=True)
class TurnCommit:
    """Everything one successful turn appends."""

    new_messages: list[dict[str, Any]] | None  # None: a /v1/completions turn (no messages)
    prompt_ids: list[int] | np.ndarray  # the rendered increment (mask 0)
    output_ids: list[int]
    logprobs: list[float]
    version_spans: list[tuple[str, int, int]]  # over output_ids
    response_id: str
    tool_call_ids: tuple[str, ...]
    content: str
    rid: str
    finish_type: str
    ended_with_stop_token: bool
    parse_errors: list[dict[str, Any]]
    agent_text: str = ""  # completions: the prompt increment and completion text the agent saw
    surface: str = "chat"
    tools: int = 0  # tools_digest of the request
    calls: tuple[tuple[str, str], ...] = ()  # (name, canonical arguments) per minted call
    committed_at: float = 0.0
    # (role, message_digest) of the new messages, when already computed (what the journal keeps:
    # a replayed turn has these, not the messages); set, it stands in for `new_messages`.
    records: list[tuple[str, int]] | None = None
    history: tuple[int, int, int] | None = None  # the request's `history_print`


def check_sampled(output_ids: Sequence[int], logprobs: Sequence[float]) -> None:
    """Refuse a generation whose logprobs do not pair one to one with its sampled ids."""
    if len(logprobs) != len(output_ids):
        raise ValueError(f"{len(output_ids)} output ids but {len(logprobs)} logprobs")


class Ledger:
    """The conversations and segments of one session and the sync/commit rules between turns."""

    def __init__(self) -> None:
        self.segments: list[Segment] = [Segment(cause=Cause.START)]
        self.conversations: list[Conversation] = [Conversation(0, None, [0])]
        self.active = 0  # the conversation that committed the last turn (new turns append to it)
        self.invalid_reason: str | None = None  # set when capture was turned off (passthrough)

    def head(self, conversation: int | None = None) -> Segment:
        """The segment a conversation's turns append to (the active conversation's by default)."""
        c = self.active if conversation is None else conversation
        return self.segments[self.conversations[c].segments[-1]]

    @property
    def current(self) -> Segment:
        """The segment new turns of the active conversation append to."""
        return self.head()

    @property
    def capturing(self) -> bool:
        """False once passthrough turned capture off."""
        return self.invalid_reason is None

    def sync(
        self,
        messages: list[dict[str, Any]],
        *,
        surface: str = "chat",
        tools: int = 0,
        conversation: int | None = None,
        raw: bytes | None = None,
    ) -> Synced | Violation:
        """The messages that are new since the conversation's last turn (the active one's by
        default), or the `Violation` that forbids appending.

        `tools` is the request's `tools_digest`, `raw` `orjson.dumps(messages)` if already made.
        Nothing in the ledger changes.
        """
        seg = self.head(conversation)
        if seg.surface not in (None, surface):
            return Violation(
                Cause.MODE_SWITCH, 0, f"the session switched from {seg.surface} to {surface} requests"
            )
        if seg.turns and tools != seg.tools:
            return Violation(Cause.TOOLS_CHANGED, 0, "the tool list changed since the previous turn")
        records = seg.records
        if len(messages) < len(records):
            return Violation(
                Cause.TRUNCATION,
                len(messages),
                f"history shrank from {len(records)} to {len(messages)} messages",
            )
        raw = orjson.dumps(messages) if raw is None else raw
        out = Synced(messages[len(records) :], history=history_print(messages, raw))
        for i in range(_known_prefix(seg, messages, raw), len(records)):
            rec, m = records[i], messages[i]
            if not isinstance(m, dict):
                return Violation(Cause.REWRITE, i, f"message {i} is not an object")
            if rec.turn >= 0:
                match = _match_turn(m, seg.turns[rec.turn])
                if match is None:
                    return Violation(
                        Cause.REWRITE, i, f"history rewritten at message {i} (a generated turn changed)"
                    )
                how, edits = match
                if how in ("ids_in_text", "calls"):
                    out.echo_matches.append((rec.turn, how))
                out.echo_edits.extend((rec.turn, f) for f in edits)
            elif m.get("role") != rec.role or message_digest(m) != rec.digest:
                return Violation(
                    Cause.REWRITE, i, f"history rewritten at message {i} (role {m.get('role')!r})"
                )
        return out

    def match(
        self,
        messages: list[dict[str, Any]],
        *,
        surface: str = "chat",
        tools: int = 0,
        new_on_miss: bool | None = None,
    ) -> Match:
        """The conversation `messages` continue, or the new one they open. Nothing changes.

        The conversation that spoke last is tried first, then the others, newest first. If none
        is extended, the request opens a new conversation when `new_on_miss` says so (True: the
        agent said it; False: the agent named a rewrite) or, left None, when every conversation
        has consumed messages and none has the request's opening (module docstring). Otherwise
        the `Violation` is the one of the conversation with that opening sharing the longest
        prefix with it.
        """
        order = [self.active] + [c for c in range(len(self.conversations) - 1, -1, -1) if c != self.active]
        misses: list[tuple[int, Violation]] = []
        raw = orjson.dumps(messages)  # once, for every conversation tried
        for c in order:
            found = self.sync(messages, surface=surface, tools=tools, conversation=c, raw=raw)
            if isinstance(found, Synced):
                return Match(c, found)
            misses.append((c, found))
        opening = _message_opening(messages)
        # A conversation is known by its opening: its system message, or that it has none. One with
        # nothing consumed yet (completions turns) cannot be told apart from the request.
        alike = [
            (c, v) for c, v in misses if not self.head(c).records or _opening_of(self.head(c)) == opening
        ]
        if new_on_miss is None:
            new_on_miss = not alike
        if not new_on_miss:
            # The one sharing the longest prefix (the first of those: the active one on a tie).
            shared = [(_shared_prefix(self.head(c), messages), c, v) for c, v in alike or misses]
            _, c, v = max(shared, key=lambda x: x[0])
            return Match(c, v)
        detail = f"a request that extends none of the session's {len(self.conversations)} conversations"
        return Match(len(self.conversations), Violation(Cause.NEW_CONVERSATION, 0, detail), opens=True)

    def sync_prompt(self, prompt: str | list[int]) -> str | list[int] | Violation:
        """For /v1/completions: the part of `prompt` (text or ids) beyond what the ledger holds."""
        seg = self.current
        if seg.surface not in (None, "completions"):
            return Violation(
                Cause.MODE_SWITCH, 0, f"the session switched from {seg.surface} to completions requests"
            )
        if isinstance(prompt, str):
            if not seg.turns or prompt.startswith(seg.text):
                return prompt[len(seg.text) :]
            return Violation(Cause.REWRITE, 0, "the prompt does not extend the text of the previous turns")
        n = len(seg.ids)
        if len(prompt) >= n and np.array_equal(np.asarray(prompt[:n], dtype=np.int32), seg.ids_view()):
            return prompt[n:]
        return Violation(Cause.REWRITE, 0, "the prompt ids do not extend the ids of the previous turns")

    def is_retry(
        self,
        messages: list[dict[str, Any]],
        *,
        surface: str = "chat",
        tools: int = 0,
        conversation: int | None = None,
    ) -> bool:
        """Whether `messages` resend exactly the request of the conversation's last turn (the
        active conversation's by default): a duplicate.

        That happens when the agent timed out or lost the reply after the turn was committed
        (a retry), or sent the same request twice at once (a concurrent duplicate); the caller
        tells the two apart by time. Nothing in the ledger changes.
        """
        seg = self.head(conversation)
        last = seg.last_turn
        if last is None or len(messages) != len(seg.records) - 1:
            return False
        records, seg.records = seg.records, seg.records[:-1]
        try:
            found = self.sync(messages, surface=surface, tools=tools, conversation=conversation)
            return not isinstance(found, Violation)
        finally:
            seg.records = records

    def rollback_last_turn(self) -> GeneratedTurn:
        """Remove the active conversation's last turn (its prompt increment, sampled ids, records
        and versions)."""
        seg = self.current
        last = seg.turns.pop()
        del seg.ids[last.prompt_start :]
        del seg.logprobs[last.prompt_start :]
        del seg.mask[last.prompt_start :]
        del seg.records[last.records_before :]
        del seg.versions[last.versions_before :]
        seg.history = None
        return last

    def focus(self, conversation: int) -> Segment:
        """Make `conversation` the active one (the next commit appends to it); its head segment."""
        if not 0 <= conversation < len(self.conversations):
            raise ValueError(f"no conversation {conversation} (the session has {len(self.conversations)})")
        self.active = conversation
        return self.current

    def new_segment(self, cause: str, detail: str = "") -> Segment:
        """Close the active conversation's segment and open an empty one in it, recording why."""
        if len(self.current) == 0:
            self.current.cause, self.current.detail = cause, detail
            self.current.surface, self.current.tools = None, 0
        else:
            self.segments.append(Segment(cause=cause, detail=detail, conversation=self.active))
            self.conversations[self.active].segments.append(len(self.segments) - 1)
        return self.current

    def open_conversation(self, parent: int | None, detail: str = "") -> Segment:
        """Open a new conversation (its first segment, cause `new_conversation`) and make it active."""
        if parent is not None and not 0 <= parent < len(self.conversations):
            raise ValueError(f"no conversation {parent} to be the parent")
        index = len(self.conversations)
        self.segments.append(Segment(cause=Cause.NEW_CONVERSATION, detail=detail, conversation=index))
        self.conversations.append(Conversation(index, parent, [len(self.segments) - 1]))
        self.active = index
        return self.current

    def invalidate(self, reason: str) -> None:
        """Turn capture off for the rest of the session (passthrough policy)."""
        if self.invalid_reason is None:
            self.invalid_reason = reason

    def commit(self, turn: TurnCommit, weight_version: str) -> GeneratedTurn:
        """Append one turn (prompt increment, then sampled ids) to the current segment."""
        seg = self.current
        n_prompt, n_out = len(turn.prompt_ids), len(turn.output_ids)
        check_sampled(turn.output_ids, turn.logprobs)
        prompt_start, records_before, versions_before = len(seg.ids), len(seg.records), len(seg.versions)
        # As int32 bytes: `array.extend` converts a list item by item (30 us for 800 ids).
        seg.ids.frombytes(np.asarray(turn.prompt_ids, dtype=np.int32).tobytes())
        seg.logprobs.frombytes(bytes(4 * n_prompt))
        seg.mask.extend(bytes(n_prompt))
        start = len(seg.ids)
        seg.ids.extend(turn.output_ids)
        seg.logprobs.extend(turn.logprobs)
        seg.mask.extend(b"\x01" * n_out)
        end = len(seg.ids)
        spans = turn.version_spans or [(weight_version, 0, n_out)]
        for version, s, e in spans:
            if seg.versions and seg.versions[-1][0] == version and seg.versions[-1][2] == start + s:
                seg.versions[-1][2] = start + e
            else:
                seg.versions.append([version, start + s, start + e])
        records = turn.records
        if records is None:
            records = [(m.get("role", ""), message_digest(m)) for m in turn.new_messages or ()]
        seg.records.extend(_Record(role, digest, -1) for role, digest in records)
        seg.text += turn.agent_text
        seg.surface = turn.surface
        seg.tools = turn.tools
        seg.history = turn.history
        gen = GeneratedTurn(
            prompt_start=prompt_start,
            records_before=records_before,
            versions_before=versions_before,
            start=start,
            end=end,
            response_id=turn.response_id,
            tool_call_ids=turn.tool_call_ids,
            content=turn.content,
            rid=turn.rid,
            finish_type=turn.finish_type,
            ended_with_stop_token=turn.ended_with_stop_token,
            parse_errors=turn.parse_errors,
            calls=turn.calls,
            committed_at=turn.committed_at,
        )
        seg.turns.append(gen)
        if turn.new_messages is not None or turn.records is not None:
            seg.records.append(_Record("assistant", 0, len(seg.turns) - 1))
        return gen

    def build_samples(
        self,
        *,
        reward: float | None,
        status: SampleStatus | None,
        rollout_id: str,
        group_index: int,
        metadata: dict[str, Any],
    ) -> list[tuple[int, Sample | None, str]]:
        """One `(segment index, sample or None, why not)` per segment, in order.

        A segment with no generated turn yields None (nothing to train on); validation against
        the hand-off contract is the caller's (`validate_sample`). `status` None: each sample's
        status describes its own segment's end (`truncated` when its last turn was cut by length).
        """
        out: list[tuple[int, Sample | None, str]] = []
        for index, seg in enumerate(self.segments):
            if not seg.turns:
                out.append((index, None, "segment has no generated turn"))
                continue
            p = seg.turns[0].start
            n = len(seg.ids) - p
            tokens = np.frombuffer(seg.ids, dtype=np.int32).copy()
            spans = _response_spans(seg.versions, p, len(seg.ids))
            conversation = self.conversations[seg.conversation]
            meta = {
                **metadata,
                "conversation": conversation.index,
                "conversation_parent": conversation.parent,
                "conversations": len(self.conversations),
                "segment": index,
                "segment_cause": seg.cause,
                "segment_cause_detail": seg.detail,
                "segments": len(self.segments),
                "turns": len(seg.turns),
                "engine_rids": [t.rid for t in seg.turns],
                "response_ids": [t.response_id for t in seg.turns],
                "turn_finish": [t.finish_type for t in seg.turns],
            }
            errors = [{"turn": i, **e} for i, t in enumerate(seg.turns) for e in t.parse_errors]
            if errors:
                meta["tool_parse_errors"] = errors
            for key, items in seg.notes.items():
                meta[key] = list(items)
            seg_status = status
            if seg_status is None:
                cut = seg.turns[-1].finish_type == "length"
                seg_status = SampleStatus.TRUNCATED if cut else SampleStatus.COMPLETED
            sample = Sample(
                tokens=tokens,
                response_length=n,
                loss_mask=np.frombuffer(bytes(seg.mask[p:]), dtype=np.uint8).copy(),
                rollout_log_probs=np.frombuffer(seg.logprobs, dtype=np.float32)[p:].copy(),
                reward=reward,
                status=seg_status,
                rollout_id=rollout_id,
                group_index=group_index,
                weight_versions=spans,
                metadata=meta,
            )
            out.append((index, sample, ""))
        return out


_SYSTEM_ROLES = ("system", "developer")


def _message_opening(messages: list[dict[str, Any]]) -> int | None:
    """A request's opening: the digest of its leading system message (None: it has none)."""
    m = messages[0] if messages else None
    return message_digest(m) if isinstance(m, dict) and m.get("role") in _SYSTEM_ROLES else None


def _opening_of(seg: Segment) -> int | None:
    """A segment's opening, from its first consumed message (as `_message_opening`)."""
    first = seg.records[0]
    return first.digest if first.role in _SYSTEM_ROLES else None


def _shared_prefix(seg: Segment, messages: list[dict[str, Any]]) -> int:
    """How many leading messages of a request are the segment's consumed ones (echoes included)."""
    n = 0
    for rec, m in zip(seg.records, messages, strict=False):
        if not isinstance(m, dict):
            break
        if rec.turn >= 0:
            same = _match_turn(m, seg.turns[rec.turn]) is not None
        else:
            same = m.get("role") == rec.role and message_digest(m) == rec.digest
        if not same:
            break
        n += 1
    return n


def _response_spans(versions: list[list[Any]], prompt_len: int, total: int) -> list[VersionSpan]:
    """Tile the response region with version spans: mask-0 stretches take the preceding version."""
    spans: list[VersionSpan] = []
    for i, (version, start, _end) in enumerate(versions):
        s = start - prompt_len
        e = (versions[i + 1][1] if i + 1 < len(versions) else total) - prompt_len
        if spans and spans[-1].version == version:
            spans[-1].end = e
        else:
            spans.append(VersionSpan(str(version), s, e))
    return spans
