"""The ledger's fast history check: a request that starts with the bytes of the last committed
request has only what follows them checked; anything else gets the full check."""

from __future__ import annotations

from typing import Any

import pytest

from rlgw.gateway.ledger import ledger as ledger_mod
from rlgw.gateway.ledger.ledger import Cause, Ledger, Synced, TurnCommit, Violation, history_print

CALL = "call_" + "a" * 24
SYSTEM = {"role": "system", "content": "You are terse."}
USER = {"role": "user", "content": "List the files."}
ECHO = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"id": CALL, "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}
    ],
}
RESULT = {"role": "tool", "tool_call_id": CALL, "content": "a.py b.py"}


def _commit(ledger: Ledger, messages: list[dict[str, Any]], new: list[dict[str, Any]], start: int) -> None:
    ledger.commit(
        TurnCommit(
            new_messages=new,
            prompt_ids=[start, start + 1],
            output_ids=[start + 2],
            logprobs=[-0.5],
            version_spans=[],
            response_id=f"chatcmpl-{start}",
            tool_call_ids=(CALL,),
            content="",
            rid=f"rid-{start}",
            finish_type="stop",
            ended_with_stop_token=True,
            parse_errors=[],
            calls=(("ls", '{"path":"."}'),),
            history=history_print(messages),
        ),
        "v1",
    )


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Roles of the messages the ledger digests while syncing."""
    seen: list[str] = []
    digest = ledger_mod.message_digest

    def counting(m: dict[str, Any]) -> int:
        seen.append(m.get("role", ""))
        return digest(m)

    monkeypatch.setattr(ledger_mod, "message_digest", counting)
    return seen


def _one_turn() -> tuple[Ledger, list[dict[str, Any]]]:
    ledger = Ledger()
    first = [SYSTEM, USER]
    _commit(ledger, first, first, 10)
    return ledger, first


def test_the_bytes_of_the_last_request_are_not_checked_again(counted: list[str]) -> None:
    ledger, first = _one_turn()
    counted.clear()
    synced = ledger.sync([*first, ECHO, RESULT])
    assert isinstance(synced, Synced) and synced.new == [RESULT]
    # Neither the system nor the user message was digested again: only the echo was matched.
    assert counted == []


def test_a_rewrite_inside_the_known_prefix_is_still_found(counted: list[str]) -> None:
    ledger, _ = _one_turn()
    rewritten = [SYSTEM, {"role": "user", "content": "List the files, then delete them."}, ECHO, RESULT]
    synced = ledger.sync(rewritten)
    assert isinstance(synced, Violation) and synced.cause == Cause.REWRITE and synced.index == 1


def test_same_messages_in_other_bytes_get_the_full_check(counted: list[str]) -> None:
    ledger, _ = _one_turn()
    counted.clear()
    reordered = [{"content": SYSTEM["content"], "role": "system"}, USER, ECHO, RESULT]
    synced = ledger.sync(reordered)
    # Key order is no rewrite (messages are compared by what they render), but every consumed
    # message was checked, since its bytes differ from the last request's.
    assert isinstance(synced, Synced) and synced.new == [RESULT]
    assert counted == ["system", "user"]


def test_the_print_follows_the_turns(counted: list[str]) -> None:
    ledger, first = _one_turn()
    second = [*first, ECHO, RESULT]
    _commit(ledger, second, [RESULT], 20)
    counted.clear()
    assert isinstance(ledger.sync([*second, ECHO, RESULT]), Synced)
    assert counted == []
    # A retried turn is rolled back: the print it left is gone, and the next sync checks everything.
    ledger.rollback_last_turn()
    assert ledger.current.history is None
    counted.clear()
    assert isinstance(ledger.sync(second), Synced)
    assert counted == ["system", "user"]


def test_a_request_the_same_length_as_the_print_is_checked_in_full(counted: list[str]) -> None:
    ledger, first = _one_turn()
    counted.clear()
    # A resend of the first request (a retry) is not longer than the print: full check.
    assert ledger.is_retry(first)
    assert counted == ["system", "user"]
