"""A turn settles after its reply: the journal row is written before the agent is answered, and
applying the turn to the ledger, its counters and the session's release follow the reply
(`turn.settle_after_reply`, wrapped by the edge around each turn request).

The gateway and the instant stub engine (`bench/stub_engine.py`: SGLang's `/generate`, real
tokenizer) run for real over HTTP in this process's threads, so the test can watch the session
at the moment the reply's last byte is handed to the server.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from bench.stub_engine import build_app as build_stub_engine
from rlgw.gateway.app import GatewayConfig, create_app
from rlgw.gateway.ledger.ledger import Ledger, Policy
from rlgw.gateway.sessions.table import Mode, Session
from rlgw.gateway.turns import lifecycle as turn_module
from tests.support.procs import serve_in_thread

KEY = "settle-tenant-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}


@dataclass
class Watch:
    """What the session looked like each time a turn request's last body byte was sent."""

    app: Any
    seen: list[tuple[int, bool]] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith("/s/"):
            await self.app(scope, receive, send)
            return
        session = self.app.state.sessions.get(path.split("/")[2])

        async def watched(message: dict[str, Any]) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.seen.append((len(session.ledger.current.turns), session.lock.locked()))

        await self.app(scope, receive, watched)


@pytest.fixture(scope="module")
def served(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Watch]]:
    config = GatewayConfig(engine_url="", data_dir=tmp_path_factory.mktemp("settle"), tenant_keys={KEY: "t"})
    with serve_in_thread(build_stub_engine(str(tiny_qwen3), 4096)) as engine_url:
        config.engine_url = engine_url
        watch = Watch(create_app(config))
        with serve_in_thread(watch) as url:
            yield url, watch


def _session(gw: str) -> dict[str, Any]:
    r = httpx.post(gw + "/v1/sessions", json={"task_id": "settle"}, headers=AUTH)
    assert r.status_code == 200, r.text
    return r.json()


def _info(gw: str, sid: str) -> dict[str, Any]:
    return httpx.get(f"{gw}/v1/sessions/{sid}", headers=AUTH).json()


@pytest.mark.parametrize("stream", [False, True])
def test_a_turn_is_applied_after_its_reply_is_sent(served: tuple[str, Watch], stream: bool) -> None:
    gw, watch = served
    s = _session(gw)
    agent = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "list the files"}]
    watch.seen.clear()
    for n in range(3):
        if stream:
            chunks = list(agent.chat.completions.create(model="m", messages=messages, stream=True))
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            content = agent.chat.completions.create(model="m", messages=messages).choices[0].message.content
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": f"and {n}?"}]
    # At each reply's last byte the session was still held and the turn not yet in the ledger;
    # by the next request (same agent, same session) it was.
    assert watch.seen == [(0, True), (1, True), (2, True)]
    info = _info(gw, s["session_id"])
    assert (info["turns"], info["failed_turns"]) == (3, 0)
    done = httpx.post(f"{gw}/v1/sessions/{s['session_id']}/finish", json={"reward": 1.0}, headers=AUTH).json()
    assert done["rejects"] == [] and len(done["samples"]) == 1


def test_a_turn_that_cannot_be_applied_is_answered_and_its_session_records_nothing(
    served: tuple[str, Watch], monkeypatch: pytest.MonkeyPatch
) -> None:
    gw, _ = served
    s = _session(gw)
    agent = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "list the files"}]
    first = agent.chat.completions.create(model="m", messages=messages).choices[0].message.content

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug in applying")

    monkeypatch.setattr(turn_module, "apply_record", broken)
    messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "again"}]
    second = agent.chat.completions.create(model="m", messages=messages)  # journaled, so answered
    monkeypatch.undo()
    info = _info(gw, s["session_id"])
    assert info["invalid_reason"] == "internal error: a committed turn could not be applied"
    # The session was released: it takes the next turn, and its finish stores nothing trainable.
    messages += [
        {"role": "assistant", "content": second.choices[0].message.content},
        {"role": "user", "content": "?"},
    ]
    agent.chat.completions.create(model="m", messages=messages)
    done = httpx.post(f"{gw}/v1/sessions/{s['session_id']}/finish", json={"reward": 1.0}, headers=AUTH).json()
    assert done["samples"] == [] and {r["reason"] for r in done["rejects"]} == {"capture_invalid"}


def _recording_session(session_id: str) -> Session:
    return Session(session_id, "t", "task", Mode.CAPTURE, "r", 0, Policy.SEGMENT, {}, {}, ledger=Ledger())


async def test_a_turn_that_ends_after_its_request_settles_at_once() -> None:
    # A scope left in a context copied from a request that already ended (a stream generator
    # finalized later, say) must not wait for that request: its session would stay locked.
    sess = _recording_session("s")
    with turn_module.settle_after_reply():
        ctx = contextvars.copy_context()

    async def late() -> None:
        async with turn_module.turn_scope(sess) as turn:
            turn.committed = True

    await asyncio.get_running_loop().create_task(late(), context=ctx)
    assert (sess.turns, sess.lock.locked()) == (1, False)


async def test_turns_committed_within_a_request_settle_when_it_ends() -> None:
    sess, other = _recording_session("s"), _recording_session("o")
    with turn_module.settle_after_reply():
        async with turn_module.turn_scope(sess) as turn:
            turn.committed = True
        async with turn_module.turn_scope(other) as turn:
            turn.committed = True
        assert (sess.turns, sess.lock.locked(), other.lock.locked()) == (0, True, True)  # not yet settled
        # A second turn of the same session in the same request settles the first before it
        # takes the lock (it would otherwise wait on it forever); the other session waits.
        async with turn_module.turn_scope(sess):
            assert sess.turns == 1 and other.turns == 0
        assert (sess.failed_turns, sess.lock.locked()) == (1, False)  # never committed: settled at once
    assert (sess.turns, other.turns, other.lock.locked()) == (1, 1, False)
