"""Applying one committed turn's record to its session: live, when the turn settles
(`turns/lifecycle.py`), and replayed from the journal, when a session is restored (`table.py`).

A record (`ledger/record.py`'s `TurnRecord`: `turns.lifecycle.commit` builds it, the journal keeps
its `to_journal` row and `table.py` reads rows back with `from_journal`) holds the
conversation it appends to (`conversation`: an index; the next index opens a new conversation whose
parent is `parent`; records written before conversations have neither and append to the active
one, then the session's only conversation), the policy's segment change, a replaced retry, notes for
the sample's metadata and the ledger commit. This module knows the session and its ledger; it
knows nothing about requests, the engine or HTTP.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rlgw.gateway.ledger.record import TurnRecord

if TYPE_CHECKING:
    from rlgw.gateway.sessions.table import Session

log = logging.getLogger(__name__)


def apply_record(session: Session, record: TurnRecord, *, committed_at: float = 0.0) -> None:
    """Apply one committed turn's record to the session (live, or replayed from the journal)."""
    if record.context_exhausted:
        session.termination_reason = "context_length_exceeded"
    ledger = session.ledger
    if ledger is None:
        return
    if record.invalidate is not None:
        ledger.invalidate(record.invalidate)
        log.warning(
            "capture turned off", extra={"fields": {"session": session.id, "reason": record.invalidate}}
        )
    turn = record.commit
    if turn is None or not ledger.capturing:
        return
    conversation = record.conversation  # None in records written before conversations
    if conversation is not None and conversation == len(ledger.conversations):
        ledger.open_conversation(record.parent, record.segment[1])  # an opening names its segment
    else:
        if conversation is not None:
            ledger.focus(conversation)
        if record.segment is not None:
            ledger.new_segment(*record.segment)
    seg = ledger.current
    if record.replace:
        old = ledger.rollback_last_turn()
        seg.note("replaced_turns", {"turn": len(seg.turns), "rid": old.rid, "response_id": old.response_id})
        log.info("turn retried", extra={"fields": {"session": session.id, "replaced_rid": old.rid}})
    for index, how in record.echo_matches:
        seg.note("echo_matches", {"turn": index, "how": how})
    for index, what in record.echo_edits:
        seg.note("echo_edits", {"turn": index, "field": what})
    for key, values in record.notes.items():
        for value in values:
            seg.note(key, value)
    if record.overridden:
        seg.note("agent_sampling", {"turn": len(seg.turns), **record.overridden})
    if record.temperature is not None:
        seg.note("turn_temperature", {"turn": len(seg.turns), "temperature": record.temperature})
    turn.committed_at = committed_at
    ledger.commit(turn, record.version)
