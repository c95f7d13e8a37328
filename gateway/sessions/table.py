"""Sessions: one per task run, each with its mode, policy, key, ledger and lock.

A session belongs to the tenant that created it; its own API key lets an agent call the
OpenAI surface without knowing the session id. This module owns the session table and the
session lifecycle (open -> finished | deleted); it knows nothing about HTTP or the engine.
"""

from __future__ import annotations

import asyncio
import enum
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from rlgw.gateway.errors import Conflict, NotFound
from rlgw.gateway.ledger.ledger import Ledger, Policy
from rlgw.gateway.ledger.record import TurnRecord
from rlgw.gateway.sessions.journal import JournaledSession, SessionJournal
from rlgw.gateway.sessions.replay import apply_record
from rlgw.gateway.tenancy.tenants import KeyTable, key_digest


class Mode(enum.StrEnum):
    """capture: record a ledger and store samples. eval: serve the same API, record nothing."""

    CAPTURE = "capture"
    EVAL = "eval"


@dataclass
class Session:
    """A task run's state on this gateway replica."""

    id: str
    tenant: str
    task_id: str
    mode: Mode
    rollout_id: str
    group_index: int
    policy: Policy
    metadata: dict[str, Any]
    sampling: dict[str, Any]
    created_at: float = field(default_factory=time.time)
    last_active: float = field(default_factory=time.monotonic)
    ledger: Ledger | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Who wins on temperature, top_p, top_k, min_p and seed: "session" (the trainer's values;
    # the agent's are recorded in metadata) or "request" (the agent's).
    sampling_precedence: str = "session"
    finishing: bool = False  # finish has started: new turns are refused
    # A shared journal holds turns this copy lacks (another gateway of the fleet served the session
    # meanwhile): the table drops the copy and restores the session from the journal on its next call.
    stale: bool = False
    finished: bool = False
    termination_reason: str | None = None
    turns: int = 0
    failed_turns: int = 0
    active_rids: set[str] = field(default_factory=set)
    summary: dict[str, Any] | None = None  # the finish summary, kept so a retried finish gets it
    # Responses API: response id -> the conversation items up to and including that response, so a
    # follow-up with `previous_response_id` can send only its new items.
    conversations: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    journal: SessionJournal | None = None  # where its committed turns are made durable

    def settings(self) -> dict[str, Any]:
        """What the journal keeps to restore the session (everything but its turns)."""
        return {
            "id": self.id,
            "tenant": self.tenant,
            "task_id": self.task_id,
            "mode": str(self.mode),
            "rollout_id": self.rollout_id,
            "group_index": self.group_index,
            "policy": str(self.policy),
            "metadata": self.metadata,
            "sampling": self.sampling,
            "sampling_precedence": self.sampling_precedence,
            "created_at": self.created_at,
        }

    def describe(self) -> dict[str, Any]:
        """The public view of the session (no key)."""
        doc: dict[str, Any] = {
            "session_id": self.id,
            "task_id": self.task_id,
            "mode": str(self.mode),
            "rollout_id": self.rollout_id,
            "group_index": self.group_index,
            "policy": str(self.policy),
            "sampling_precedence": self.sampling_precedence,
            "metadata": self.metadata,
            "created_at": self.created_at,
            "finished": self.finished,
            "termination_reason": self.termination_reason,
            "turns": self.turns,
            "failed_turns": self.failed_turns,
        }
        if self.ledger is not None:
            doc["capturing"] = self.ledger.capturing
            doc["invalid_reason"] = self.ledger.invalid_reason
            doc["segments"] = len(self.ledger.segments)
            doc["conversations"] = len(self.ledger.conversations)
            doc["tokens"] = len(self.ledger.current)
            doc["trainable_tokens"] = sum(s.trainable_tokens() for s in self.ledger.segments)
        return doc


class SessionTable:
    """All open sessions of this replica, by id and by key."""

    def __init__(self, journal: SessionJournal | None = None) -> None:
        self._sessions: dict[str, Session] = {}
        self._keys = KeyTable()
        self._key_of: dict[str, bytes] = {}  # session id -> its key's digest
        self.journal = journal

    def create(
        self,
        *,
        tenant: str,
        task_id: str,
        mode: Mode,
        rollout_id: str | None,
        group_index: int,
        policy: Policy,
        metadata: dict[str, Any],
        sampling: dict[str, Any],
        sampling_precedence: str | None = None,
    ) -> tuple[Session, str]:
        """Open a session; returns it and its API key (shown once, stored only as a digest)."""
        sid = "s-" + uuid.uuid4().hex
        key = "sk-rlgw-" + secrets.token_urlsafe(24)
        session = Session(
            id=sid,
            tenant=tenant,
            task_id=task_id,
            mode=mode,
            rollout_id=rollout_id or uuid.uuid4().hex,
            group_index=group_index,
            policy=policy,
            metadata=metadata,
            sampling=sampling,
            sampling_precedence=sampling_precedence or ("session" if mode is Mode.CAPTURE else "request"),
            ledger=Ledger() if mode is Mode.CAPTURE else None,
            journal=self.journal,
        )
        self._hold(session, key_digest(key))
        return session, key

    def key_digest_of(self, session_id: str) -> bytes:
        """The digest of the session's key (what the journal keeps)."""
        return self._key_of[session_id]

    def _hold(self, session: Session, digest: bytes) -> None:
        self._sessions[session.id] = session
        self._keys.add_digest(digest, session.id)
        self._key_of[session.id] = digest

    def restore(self, saved: JournaledSession) -> Session:
        """Hold a session the journal kept: its settings, its key, and its turns replayed."""
        doc = saved.doc
        mode = Mode(doc["mode"])
        session = Session(
            id=doc["id"],
            tenant=doc["tenant"],
            task_id=doc["task_id"],
            mode=mode,
            rollout_id=doc["rollout_id"],
            group_index=doc["group_index"],
            policy=Policy(doc["policy"]),
            metadata=doc["metadata"],
            sampling=doc["sampling"],
            sampling_precedence=doc["sampling_precedence"],
            created_at=doc["created_at"],
            ledger=Ledger() if mode is Mode.CAPTURE else None,
            journal=self.journal,
        )
        for record in saved.turns:
            apply_record(session, TurnRecord.from_journal(record))
            session.turns += 1
        self._hold(session, saved.key_digest)
        return session

    def restore_all(self, finished: set[str] | frozenset[str] = frozenset()) -> int:
        """Hold every session the journal kept (at start-up); returns how many.

        `finished` names the sessions whose samples are already in the store: a gateway killed
        between storing a finish and forgetting its journal rows must not restore that session,
        or a second finish would store its samples twice. Those are forgotten instead.
        """
        if self.journal is None:
            return 0
        for sid in finished:
            self.journal.forget(sid)
        saved = self.journal.load_all()
        for s in saved:
            self.restore(s)
        return len(saved)

    def _from_journal(self, session_id: str) -> Session | None:
        """A session another gateway on this data dir opened (or this one before a restart)."""
        if self.journal is None or not session_id.startswith("s-"):
            return None
        saved = self.journal.load(session_id)
        return self.restore(saved) if saved is not None else None

    def get(self, session_id: str, tenant: str | None = None) -> Session:
        """The session, or NotFound (also when it belongs to another tenant)."""
        s = self._sessions.get(session_id)
        if s is not None and s.stale:
            self.remove(session_id)
            s = None
        s = s or self._from_journal(session_id)
        if s is None or (tenant is not None and s.tenant != tenant):
            raise NotFound(f"no session {session_id!r}", param="session_id")
        return s

    def get_open(self, session_id: str, tenant: str | None = None) -> Session:
        """The session if it is still open, else Conflict."""
        s = self.get(session_id, tenant)
        if s.finished or s.finishing:
            raise Conflict(f"session {session_id!r} is finished", param="session_id", code="session_finished")
        return s

    def by_key(self, key: str) -> Session | None:
        """The session whose API key is `key`."""
        sid = self._keys.owner(key)
        if sid is None and self.journal is not None:
            sid = self.journal.session_for_key(key_digest(key))
            return self.get(sid) if sid else None
        return self._sessions.get(sid) if sid else None

    def check_key(self, session: Session, key: str | None) -> bool:
        """Whether `key` is `session`'s key (constant-time)."""
        return key is not None and self._keys.owner(key) == session.id

    def remove(self, session_id: str) -> Session | None:
        """Forget a session and its key."""
        s = self._sessions.pop(session_id, None)
        digest = self._key_of.pop(session_id, None)
        if digest is not None:
            self._keys.remove_digest(digest)
        return s

    def expired(self, idle_seconds: float) -> list[Session]:
        """Sessions not used for `idle_seconds` (finished ones included), oldest first."""
        cutoff = time.monotonic() - idle_seconds
        stale = [s for s in self._sessions.values() if s.last_active < cutoff and not s.lock.locked()]
        return sorted(stale, key=lambda s: s.last_active)

    def counts(self) -> tuple[int, int]:
        """(open, finished) sessions held."""
        finished = sum(1 for s in self._sessions.values() if s.finished)
        return len(self._sessions) - finished, finished

    def __len__(self) -> int:
        return len(self._sessions)
