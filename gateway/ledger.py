"""The token ledger of one session: what the model was fed and what it sampled, token for token.

Per segment the ledger keeps compact arrays — token ids (int32), logprobs (float32), loss mask
(uint8) — plus the weight version of every generated token, the signatures of the messages it
has consumed, and the turns it generated (keyed by the response and tool-call ids it minted).

Sync rule: the agent resends its whole history each turn. Messages already consumed must come
back unchanged (same signature), and the assistant turns the gateway generated must come back
matched by their tool-call ids (or, for plain answers, their content): their *sampled* tokens
stay in the ledger, so re-serialized arguments or stripped reasoning are not differences. Only
the messages after the consumed prefix are new. A shrunk or rewritten prefix is a `Violation`,
handled by the session's policy (a new segment, passthrough, or refusal).

Appending is atomic per turn: the prompt increment and the sampled ids are committed together,
after the engine answered, so a failed or aborted turn leaves the ledger as it was.

This module knows nothing about HTTP, templates or the engine's wire format.
"""

from __future__ import annotations

import enum
from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import xxhash

from rlgw.gateway.sample import Sample, SampleStatus, VersionSpan


class Policy(enum.StrEnum):
    """What to do when the agent shrinks or rewrites history it already sent."""

    SEGMENT = "segment"  # close the segment (it becomes its own sample) and start a new one
    PASSTHROUGH = "passthrough"  # stop capturing; serve the rest; the session's samples are invalid
    REFUSE = "refuse"  # answer 409 and change nothing


@dataclass(frozen=True, slots=True)
class Violation:
    """The incoming history is not an extension of what the ledger consumed."""

    kind: str  # "shrank" | "rewritten"
    index: int  # first message that differs (or the new length, for "shrank")
    detail: str

    def __str__(self) -> str:
        return self.detail


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


@dataclass(slots=True)
class _Record:
    """One consumed message: its digest, or the generated turn it corresponds to."""

    role: str
    digest: int
    turn: int  # index into Segment.turns, or -1 for messages the agent supplied


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def message_digest(m: dict[str, Any]) -> int:
    """Signature of a message the agent supplied: role and content shape and value.

    Keys that do not change what the model sees (none/empty values) are left out, so a
    client that adds `"name": null` on resend is not a rewrite.
    """
    keep = {
        k: m[k]
        for k in ("role", "content", "name", "tool_call_id", "tool_calls")
        if m.get(k) not in (None, "")
    }
    return xxhash.xxh3_64_intdigest(orjson.dumps(keep, option=orjson.OPT_SORT_KEYS))


def _matches_turn(m: dict[str, Any], turn: GeneratedTurn) -> bool:
    if m.get("role") != "assistant":
        return False
    ids = tuple(tc.get("id", "") for tc in (m.get("tool_calls") or []) if isinstance(tc, dict))
    if turn.tool_call_ids or ids:
        return sorted(ids) == sorted(turn.tool_call_ids)
    return _text(m.get("content")).strip() == turn.content.strip()


@dataclass
class Segment:
    """One contiguous token series; becomes one training sample."""

    cause: str
    ids: array = field(default_factory=lambda: array("i"))
    logprobs: array = field(default_factory=lambda: array("f"))
    mask: bytearray = field(default_factory=bytearray)
    # (version, start, end) over absolute positions of generated tokens, merged when adjacent.
    versions: list[list[Any]] = field(default_factory=list)
    turns: list[GeneratedTurn] = field(default_factory=list)
    records: list[_Record] = field(default_factory=list)
    # /v1/completions only: the text the agent has seen (its prompts and our completions).
    text: str = ""

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
    prompt_ids: list[int]  # the rendered increment (mask 0)
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


class Ledger:
    """The segments of one session and the sync/commit rules between turns."""

    def __init__(self) -> None:
        self.segments: list[Segment] = [Segment(cause="start")]
        self.invalid_reason: str | None = None  # set when capture was turned off (passthrough)

    @property
    def current(self) -> Segment:
        """The segment new turns append to."""
        return self.segments[-1]

    @property
    def capturing(self) -> bool:
        """False once passthrough turned capture off."""
        return self.invalid_reason is None

    def sync(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]] | Violation:
        """The messages that are new since the last turn, or the `Violation` that forbids appending."""
        seg = self.current
        records = seg.records
        if len(messages) < len(records):
            return Violation(
                "shrank", len(messages), f"history shrank from {len(records)} to {len(messages)} messages"
            )
        for i, rec in enumerate(records):
            m = messages[i]
            if not isinstance(m, dict):
                return Violation("rewritten", i, f"message {i} is not an object")
            if rec.turn >= 0:
                ok = _matches_turn(m, seg.turns[rec.turn])
            else:
                ok = m.get("role") == rec.role and message_digest(m) == rec.digest
            if not ok:
                return Violation("rewritten", i, f"history rewritten at message {i} (role {m.get('role')!r})")
        return messages[len(records) :]

    def sync_prompt(self, prompt: str | list[int]) -> str | list[int] | Violation:
        """For /v1/completions: the part of `prompt` (text or ids) beyond what the ledger holds."""
        seg = self.current
        if seg.records:
            return Violation("rewritten", 0, "a chat session cannot continue with a completions prompt")
        if isinstance(prompt, str):
            if not seg.turns or prompt.startswith(seg.text):
                return prompt[len(seg.text) :]
            return Violation("rewritten", 0, "the prompt does not extend the text of the previous turns")
        n = len(seg.ids)
        if len(prompt) >= n and np.array_equal(np.asarray(prompt[:n], dtype=np.int32), seg.ids_view()):
            return prompt[n:]
        return Violation("rewritten", 0, "the prompt ids do not extend the ids of the previous turns")

    def is_retry(self, messages: list[dict[str, Any]]) -> bool:
        """Whether `messages` resend exactly the request of the last turn (a client retry).

        That happens when the agent timed out or lost the reply after the turn was committed:
        the agent never saw that output, so the turn may be rolled back and generated again.
        """
        seg = self.current
        last = seg.last_turn
        if last is None or len(messages) != len(seg.records) - 1:
            return False
        records, seg.records = seg.records, seg.records[:-1]
        try:
            return not isinstance(self.sync(messages), Violation)
        finally:
            seg.records = records

    def rollback_last_turn(self) -> None:
        """Remove the last turn (its prompt increment, sampled ids, records and versions)."""
        seg = self.current
        last = seg.turns.pop()
        del seg.ids[last.prompt_start :]
        del seg.logprobs[last.prompt_start :]
        del seg.mask[last.prompt_start :]
        del seg.records[last.records_before :]
        del seg.versions[last.versions_before :]

    def new_segment(self, cause: str) -> Segment:
        """Close the current segment and open an empty one, recording why."""
        if len(self.current) == 0:
            self.current.cause = cause
        else:
            self.segments.append(Segment(cause=cause))
        return self.current

    def invalidate(self, reason: str) -> None:
        """Turn capture off for the rest of the session (passthrough policy)."""
        if self.invalid_reason is None:
            self.invalid_reason = reason

    def commit(self, turn: TurnCommit, weight_version: str) -> GeneratedTurn:
        """Append one turn (prompt increment, then sampled ids) to the current segment."""
        seg = self.current
        n_prompt, n_out = len(turn.prompt_ids), len(turn.output_ids)
        if len(turn.logprobs) != n_out:
            raise ValueError(f"{n_out} output ids but {len(turn.logprobs)} logprobs")
        prompt_start, records_before, versions_before = len(seg.ids), len(seg.records), len(seg.versions)
        seg.ids.extend(turn.prompt_ids)
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
        for m in turn.new_messages or ():
            seg.records.append(_Record(m.get("role", ""), message_digest(m), -1))
        seg.text += turn.agent_text
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
        )
        seg.turns.append(gen)
        if turn.new_messages is not None:
            seg.records.append(_Record("assistant", 0, len(seg.turns) - 1))
        return gen

    def build_samples(
        self,
        *,
        reward: float | None,
        status: SampleStatus,
        rollout_id: str,
        group_index: int,
        metadata: dict[str, Any],
    ) -> list[tuple[int, Sample | None, str]]:
        """One `(segment index, sample or None, why not)` per segment, in order.

        A segment with no generated turn yields None (nothing to train on); validation against
        the hand-off contract is the caller's (`validate_sample`).
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
            meta = {
                **metadata,
                "segment": index,
                "segment_cause": seg.cause,
                "segments": len(self.segments),
                "engine_rids": [t.rid for t in seg.turns],
                "response_ids": [t.response_id for t in seg.turns],
                "turn_finish": [t.finish_type for t in seg.turns],
            }
            errors = [{"turn": i, **e} for i, t in enumerate(seg.turns) for e in t.parse_errors]
            if errors:
                meta["tool_parse_errors"] = errors
            sample = Sample(
                tokens=tokens,
                response_length=n,
                loss_mask=np.frombuffer(bytes(seg.mask[p:]), dtype=np.uint8).copy(),
                rollout_log_probs=np.frombuffer(seg.logprobs, dtype=np.float32)[p:].copy(),
                reward=reward,
                status=status,
                rollout_id=rollout_id,
                group_index=group_index,
                weight_versions=spans,
                metadata=meta,
            )
            out.append((index, sample, ""))
        return out


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
