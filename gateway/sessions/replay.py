"""Applying one committed turn's record to its session: live, when the turn settles
(`turns/lifecycle.py`), and replayed from the journal, when a session is restored (`table.py`).

A record is what the journal keeps of a turn (`turns.lifecycle.commit` writes it): the
conversation it appends to (`conversation`: an index; the next index opens a new conversation whose
parent is `parent`; records written before conversations have neither and append to the active
one, then the session's only conversation), the policy's segment change, a replaced retry, notes for
the sample's metadata and the ledger commit. This module knows the session and its ledger; it
knows nothing about requests, the engine or HTTP.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from rlgw.gateway.ledger.ledger import TurnCommit

if TYPE_CHECKING:
    from rlgw.gateway.sessions.table import Session

log = logging.getLogger(__name__)


def apply_record(session: Session, record: dict[str, Any], *, committed_at: float = 0.0) -> None:
    """Apply one committed turn's record to the session (live, or replayed from the journal)."""
    if record.get("context_exhausted"):
        session.termination_reason = "context_length_exceeded"
    ledger = session.ledger
    if ledger is None:
        return
    if record.get("invalidate") is not None:
        ledger.invalidate(record["invalidate"])
        log.warning(
            "capture turned off", extra={"fields": {"session": session.id, "reason": record["invalidate"]}}
        )
    spec = record.get("commit")
    if spec is None or not ledger.capturing:
        return
    conversation = record.get("conversation")  # absent in records written before conversations
    if conversation is not None and conversation == len(ledger.conversations):
        ledger.open_conversation(record.get("parent"), record["segment"][1])
    else:
        if conversation is not None:
            ledger.focus(conversation)
        if record.get("segment") is not None:
            ledger.new_segment(*record["segment"])
    seg = ledger.current
    if record.get("replace"):
        old = ledger.rollback_last_turn()
        seg.note("replaced_turns", {"turn": len(seg.turns), "rid": old.rid, "response_id": old.response_id})
        log.info("turn retried", extra={"fields": {"session": session.id, "replaced_rid": old.rid}})
    for index, how in record.get("echo_matches") or ():
        seg.note("echo_matches", {"turn": index, "how": how})
    for index, what in record.get("echo_edits") or ():
        seg.note("echo_edits", {"turn": index, "field": what})
    for key, values in (record.get("notes") or {}).items():
        for value in values:
            seg.note(key, value)
    if record.get("overridden"):
        seg.note("agent_sampling", {"turn": len(seg.turns), **record["overridden"]})
    if record.get("temperature") is not None:
        seg.note("turn_temperature", {"turn": len(seg.turns), "temperature": record["temperature"]})
    ledger.commit(
        TurnCommit(
            **{
                **spec,
                "tool_call_ids": tuple(spec["tool_call_ids"]),
                "calls": tuple(tuple(c) for c in spec["calls"]),
                "version_spans": [tuple(v) for v in spec["version_spans"]],
                "history": tuple(spec["history"]) if spec.get("history") else None,
                "committed_at": committed_at,
            }
        ),
        record["version"],
    )
