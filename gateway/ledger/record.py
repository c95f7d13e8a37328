"""One committed turn's record: what `turns.lifecycle.commit` journals, and what
`sessions.replay.apply_record` applies to the session, live or replayed from the journal.

The record is built once, typed, at commit; `to_journal` gives the journal's dict and
`from_journal` reads one back (old rows included: a row written before conversations has no
`conversation` or `parent`). The dict's keys and their order are the journal's format: the file
and PostgreSQL journals keep `orjson` of it byte for byte, so they are written here only. This
module knows the ledger's `TurnCommit`; it knows nothing about sessions, requests or the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlgw.gateway.ledger.ledger import TurnCommit
from rlgw.gateway.sample import routing_from_json, routing_to_json


@dataclass(slots=True)
class TurnRecord:
    """A committed turn: the session-level facts, and `commit` (None: the turn is not recorded,
    eval mode or capture off) with the policy's changes to apply before it."""

    version: str  # the weight version the engine reported
    invalidate: str | None = None  # passthrough: turn capture off (this turn is not recorded)
    context_exhausted: bool = False  # the generation filled the model's whole context
    commit: TurnCommit | None = None
    # The conversation it appends to (None: the active one, or a row written before conversations).
    conversation: int | None = None
    parent: int | None = None
    segment: tuple[str, str] | None = None  # (cause, detail): open a new segment first
    replace: bool = False  # a client retry: this turn replaces the last one
    echo_matches: list[tuple[int, str]] = field(default_factory=list)
    echo_edits: list[tuple[int, str]] = field(default_factory=list)
    overridden: dict[str, Any] = field(default_factory=dict)  # agent sampling the session overrode
    notes: dict[str, list[Any]] = field(default_factory=dict)  # for the sample's metadata
    temperature: float | None = None  # the temperature the engine sampled at

    def to_journal(self) -> dict[str, Any]:
        """The journal's row (the commit's `committed_at` is the live clock's: not journaled)."""
        row: dict[str, Any] = {
            "invalidate": self.invalidate,
            "context_exhausted": self.context_exhausted,
            "version": self.version,
        }
        c = self.commit
        if c is None:
            return row
        row.update(
            conversation=self.conversation,
            parent=self.parent,
            segment=self.segment,
            replace=self.replace,
            echo_matches=self.echo_matches,
            echo_edits=self.echo_edits,
            overridden=self.overridden,
            notes=self.notes,
            temperature=self.temperature,
            commit={
                # Their digests (`records`), not the messages: all the ledger keeps of them.
                "new_messages": None,
                "records": c.records,
                "prompt_ids": c.prompt_ids,
                "output_ids": c.output_ids,
                "logprobs": c.logprobs,
                "version_spans": c.version_spans,
                "response_id": c.response_id,
                "tool_call_ids": c.tool_call_ids,
                "content": c.content,
                "rid": c.rid,
                "finish_type": c.finish_type,
                "ended_with_stop_token": c.ended_with_stop_token,
                "parse_errors": c.parse_errors,
                "agent_text": c.agent_text,
                "surface": c.surface,
                "tools": c.tools,
                "calls": c.calls,
                "history": c.history,
            },
        )
        if c.routed_experts is not None:  # a MoE turn's; a dense model's rows stay as they were
            row["commit"]["routed_experts"] = routing_to_json(c.routed_experts)
        return row

    @classmethod
    def from_journal(cls, row: dict[str, Any]) -> TurnRecord:
        """A journal row back as a record (rows of every format the journal has written)."""
        spec = row.get("commit")
        commit = None
        if spec is not None:
            commit = TurnCommit(
                **{
                    **spec,
                    "tool_call_ids": tuple(spec["tool_call_ids"]),
                    "calls": tuple(tuple(c) for c in spec["calls"]),
                    "version_spans": [tuple(v) for v in spec["version_spans"]],
                    "history": tuple(spec["history"]) if spec.get("history") else None,
                    "routed_experts": routing_from_json(spec.get("routed_experts")),
                }
            )
        segment = row.get("segment")
        return cls(
            version=row["version"],
            invalidate=row.get("invalidate"),
            context_exhausted=bool(row.get("context_exhausted")),
            commit=commit,
            conversation=row.get("conversation"),
            parent=row.get("parent"),
            segment=None if segment is None else (segment[0], segment[1]),
            replace=bool(row.get("replace")),
            echo_matches=[(i, how) for i, how in row.get("echo_matches") or ()],
            echo_edits=[(i, what) for i, what in row.get("echo_edits") or ()],
            overridden=row.get("overridden") or {},
            notes=row.get("notes") or {},
            temperature=row.get("temperature"),
        )
