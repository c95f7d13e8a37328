"""The turn lifecycle exists once: every surface, streamed or not, leaves the same counters and
the same ledger after a failure, a disconnect and a success (`gateway/turns/lifecycle.py`)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from rlgw.gateway.errors import InvalidRequest
from rlgw.gateway.ledger.ledger import Ledger, Policy
from rlgw.gateway.model.profile import ModelProfile
from rlgw.gateway.model.render import ChatRenderer
from rlgw.gateway.sessions.finish import bad_token_turn
from rlgw.gateway.sessions.table import Mode, Session
from rlgw.gateway.turns.lifecycle import Turn
from rlgw.gateway.turns.messages import ChatParams, plan_turn
from tests.gateway.test_api import A, finish, info, session
from tests.support.fault_engine import FaultEngine

BODIES: dict[str, dict[str, Any]] = {
    "chat/completions": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "completions": {"model": "m", "prompt": "Once upon a time", "max_tokens": 4},
    "messages": {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
    "responses": {"model": "m", "input": "hi"},
}


def _post(s: dict[str, Any], surface: str, stream: bool, timeout: float = 30.0) -> httpx.Response:
    body = {**BODIES[surface], "stream": stream}
    headers = {"Authorization": f"Bearer {s['api_key']}", "x-api-key": s["api_key"]}
    with httpx.Client(timeout=timeout) as c:
        r = c.post(f"{s['base_url']}/{surface}", json=body, headers=headers)
        _ = r.content  # read a streamed body to its end
        return r


def _counters(gw: str, sid: str) -> tuple[int, int, int, int]:
    d = info(gw, sid)
    return d["turns"], d["failed_turns"], d["segments"], d["tokens"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("surface", list(BODIES))
def test_failure_disconnect_success_leave_the_same_state_on_every_surface(
    gw: str, fe: FaultEngine, surface: str, stream: bool
) -> None:
    s = session(gw)
    sid = s["session_id"]
    probe = _post(s, surface, stream)
    if probe.status_code == 404:
        pytest.skip(f"no /{surface} route on this gateway")
    assert probe.status_code == 200, probe.text
    after_success = _counters(gw, sid)
    assert after_success[:3] == (1, 0, 1) and after_success[3] > 0

    # An engine failure: no turn, one failed turn, the ledger as it was.
    fe.script[:] = ["500"]
    r = _post(s, surface, stream)
    assert r.status_code == 502  # streamed too: the head waits for the engine's first answer
    assert _counters(gw, sid) == (1, 1, 1, after_success[3])

    # A client that leaves mid-turn: the engine request is aborted, the ledger as it was.
    fe.script[:] = ["slow"]
    with pytest.raises(httpx.TimeoutException):
        _post(s, surface, stream, timeout=0.5)
    deadline = time.monotonic() + 10
    while _counters(gw, sid)[1] < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _counters(gw, sid) == (1, 2, 1, after_success[3])
    assert fe.aborted, "the engine request of the abandoned turn was aborted"
    time.sleep(3)  # let the slow engine call end before the next test scripts it

    summary = finish(gw, sid)
    assert len(summary["samples"]) == 1 and summary["rejects"] == []


def _profile(tokenizer: Any, *, explicit: bool) -> ModelProfile:
    renderer = ChatRenderer(tokenizer)
    return ModelProfile("chatml", tokenizer, renderer, 4096, "hermes", False, tool_parser_explicit=explicit)


def test_tools_on_a_template_that_cannot_render_them_are_refused(tiny_chatml: Any) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_chatml)
    params = ChatParams(
        messages=[{"role": "user", "content": "hi"}],
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        tool_choice=None,
        parallel_tool_calls=True,
        sampling={},
        max_tokens=None,
        logprobs=False,
        top_logprobs=0,
        stream=False,
        include_usage=False,
        template_kwargs={},
    )
    sess = Session("s", "t", "task", Mode.CAPTURE, "r", 0, Policy.SEGMENT, {}, {}, ledger=Ledger())
    with pytest.raises(InvalidRequest) as err:
        plan_turn(_profile(tok, explicit=False), sess, Turn(sess, "rid", 0.0), params)
    assert err.value.param == "tools"
    # An operator who named the tool parser says the agent describes its tools itself.
    plan = plan_turn(_profile(tok, explicit=True), sess, Turn(sess, "rid", 0.0), params)
    assert len(plan.input_ids) > 0 and sess.ledger is not None and not sess.ledger.current.turns


def test_a_bad_token_reject_names_its_turn() -> None:
    from rlgw.gateway.ledger.ledger import TurnCommit

    ledger = Ledger()
    for i, out in enumerate(([5, 6], [7, 99_999])):
        ledger.commit(
            TurnCommit(
                [{"role": "user", "content": str(i)}],
                [1, 2],
                out,
                [-0.1] * len(out),
                [],
                f"r{i}",
                (),
                "",
                f"rid{i}",
                "stop",
                True,
                [],
            ),
            "v1",
        )
    assert bad_token_turn(ledger.current, vocab_size=1000) == 1


def test_finish_summary_lists_segments_with_their_causes(gw: str) -> None:
    s = session(gw)
    r = _post(s, "chat/completions", False)
    assert r.status_code == 200
    summary = httpx.post(gw + f"/v1/sessions/{s['session_id']}/finish", json={}, headers=A).json()
    [seg] = summary["segment_causes"]
    assert seg["cause"] == "start" and seg["trainable_tokens"] == summary["trainable_tokens"] > 0


def test_each_sample_status_describes_its_own_segment() -> None:
    from rlgw.gateway.ledger.ledger import TurnCommit

    ledger = Ledger()

    def turn(finish: str) -> TurnCommit:
        return TurnCommit(
            [{"role": "user", "content": finish}],
            [1],
            [5, 6],
            [-0.1, -0.2],
            [],
            "r",
            (),
            "",
            "rid",
            finish,
            finish == "stop",
            [],
        )

    ledger.commit(turn("stop"), "v1")  # the first segment ended normally
    ledger.new_segment("rewrite", "history rewritten")
    ledger.commit(turn("length"), "v1")  # the second was cut by max_tokens
    built = ledger.build_samples(reward=1.0, status=None, rollout_id="r", group_index=0, metadata={})
    assert [s.status.value for _, s, _ in built if s is not None] == ["completed", "truncated"]


def _chat_params(messages: list[dict[str, Any]]) -> ChatParams:
    return ChatParams(
        messages=messages,
        tools=None,
        tool_choice=None,
        parallel_tool_calls=True,
        sampling={},
        max_tokens=8,
        logprobs=False,
        top_logprobs=0,
        stream=False,
        include_usage=False,
        template_kwargs={},
    )


@pytest.mark.parametrize("early_fails", [False, True])
async def test_reply_independent_work_is_done_while_the_engine_generates(
    tiny_qwen3: Any, fe: FaultEngine, monkeypatch: pytest.MonkeyPatch, early_fails: bool
) -> None:
    from rlgw.gateway.engine_client.backend import SGLangBackend
    from rlgw.gateway.model.profile import build_profile
    from rlgw.gateway.turns import messages as chat

    profile = build_profile({"tokenizer_path": str(tiny_qwen3), "max_context_length": 4096})
    backend = SGLangBackend(fe.url)
    engine = {"state": "idle"}
    request = backend._transport.request

    async def watched_request(*args: Any, **kwargs: Any) -> Any:
        engine["state"] = "generating"  # from here until the reply's head is read
        reply = await request(*args, **kwargs)
        engine["state"] = "answered"
        return reply

    monkeypatch.setattr(backend._transport, "request", watched_request)
    seen: list[str] = []

    class Watched(chat.TurnDecoder):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            seen.append(engine["state"])
            if early_fails and len(seen) == 1:
                raise RuntimeError("a failure of the early work")
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(chat, "TurnDecoder", Watched)
    sess = Session("s", "t", "task", Mode.CAPTURE, "r", 0, Policy.SEGMENT, {}, {}, ledger=Ledger())
    try:
        first = await chat.run_chat(backend, profile, sess, _chat_params([{"role": "user", "content": "hi"}]))
        echo = {"role": "assistant", "content": first.parsed.content}
        messages = [{"role": "user", "content": "hi"}, echo, {"role": "user", "content": "and now?"}]
        second = await chat.run_chat(backend, profile, sess, _chat_params(messages))
    finally:
        await backend.aclose()
    # The decoder of each turn was built while the engine was generating; a failure there is
    # not lost: the decoder is built again after the reply, where an error would surface.
    assert seen == (["generating", "answered", "generating"] if early_fails else ["generating"] * 2)
    seg = sess.ledger.current
    assert [t.content for t in seg.turns] == [first.parsed.content, second.parsed.content]
    assert len(seg.records) == 4  # user, assistant, user, assistant: the digests the journal keeps
