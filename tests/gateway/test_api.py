"""The gateway's HTTP contract with a scripted engine: errors, auth, policies, atomic turns."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.support.fault_engine import FaultEngine

A = {"Authorization": "Bearer key-a-0123456789"}
B = {"Authorization": "Bearer key-b-0123456789"}


@pytest.fixture(autouse=True)
def _reset(fe: FaultEngine) -> None:
    fe.script.clear()
    fe.calls.clear()


def session(gw: str, headers: dict = A, **body: Any) -> dict[str, Any]:
    r = httpx.post(gw + "/v1/sessions", json={"task_id": "t", **body}, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def client(s: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)


def info(gw: str, sid: str, headers: dict = A) -> dict[str, Any]:
    return httpx.get(gw + f"/v1/sessions/{sid}", headers=headers).json()


def finish(gw: str, sid: str, headers: dict = A, **body: Any) -> dict[str, Any]:
    r = httpx.post(gw + f"/v1/sessions/{sid}/finish", json={"reward": 1.0, **body}, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"n": 2}, "n > 1"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": []}, "tool_choice"),
        ({"temperature": 7}, "temperature"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"top_logprobs": 3}, "top_logprobs"),
    ],
)
def test_unsupported_or_invalid_requests_are_openai_400s(gw: str, extra: dict, message: str) -> None:
    s = session(gw)
    with pytest.raises(openai.BadRequestError) as err:
        client(s).chat.completions.create(model="m", messages=USER, **extra)
    assert err.value.status_code == 400
    assert message in err.value.body["message"]
    assert info(gw, s["session_id"])["tokens"] == 0


def test_bad_bodies_and_parts(gw: str) -> None:
    s = session(gw)
    url = s["base_url"] + "/chat/completions"
    auth = {"Authorization": f"Bearer {s['api_key']}"}
    r = httpx.post(url, content=b"{not json", headers=auth)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    r = httpx.post(url, json={"messages": image}, headers=auth)
    assert r.status_code == 400 and "image_url" in r.json()["error"]["message"]
    r = httpx.post(url, json={"messages": [{"role": "wizard", "content": "x"}]}, headers=auth)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].role"
    # Unknown fields real clients send are ignored.
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    r = httpx.post(url, json={"messages": parts, "user": "x", "store": False, "metadata": {}}, headers=auth)
    assert r.status_code == 200, r.text


def test_tenants_and_keys(gw: str) -> None:
    assert httpx.post(gw + "/v1/sessions", json={"task_id": "t"}).status_code == 401
    bad = {"Authorization": "Bearer key-a-0123456788"}
    assert httpx.post(gw + "/v1/sessions", json={"task_id": "t"}, headers=bad).status_code == 401
    s = session(gw, A)
    sid = s["session_id"]
    assert httpx.get(gw + f"/v1/sessions/{sid}", headers=B).status_code == 404
    assert httpx.post(gw + f"/v1/sessions/{sid}/finish", json={}, headers=B).status_code == 404
    assert httpx.delete(gw + f"/v1/sessions/{sid}", headers=B).status_code == 404
    # The session key works on /v1 without the id; a wrong key does not; the path needs a key here.
    ok = openai.OpenAI(base_url=gw + "/v1", api_key=s["api_key"], max_retries=0)
    assert ok.chat.completions.create(model="m", messages=USER).choices[0].message.content == "Hello there."
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gw + "/v1", api_key="sk-nope", max_retries=0).models.list()
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=s["base_url"], api_key="sk-nope", max_retries=0).models.list()
    summary = finish(gw, sid)
    assert len(summary["samples"]) == 1
    cursor = summary["samples"][0]["cursor"]
    assert httpx.get(gw + f"/v1/trajectories/{cursor}", headers=A).status_code == 200
    assert httpx.get(gw + f"/v1/trajectories/{cursor}", headers=B).status_code == 404
    assert f'"cursor":{cursor},' not in httpx.get(gw + "/v1/trajectories?limit=1000", headers=B).text


def test_failed_turns_leave_the_ledger_as_it_was(gw: str, fe: FaultEngine) -> None:
    s = session(gw)
    c = client(s)
    c.chat.completions.create(model="m", messages=USER)
    before = info(gw, s["session_id"])
    history = [*USER, {"role": "assistant", "content": "Hello there."}, {"role": "user", "content": "more"}]
    for fault, error in (("500", openai.InternalServerError), ("abort", openai.APIStatusError)):
        fe.script[:] = [fault]
        with pytest.raises(error):
            c.chat.completions.create(model="m", messages=history)
        assert info(gw, s["session_id"])["tokens"] == before["tokens"]
    fe.script[:] = ["drop"]
    with pytest.raises(openai.APIError):
        for _ in c.chat.completions.create(model="m", messages=history, stream=True):
            pass
    after = info(gw, s["session_id"])
    assert after["tokens"] == before["tokens"] and after["failed_turns"] == 3
    c.chat.completions.create(model="m", messages=history)
    summary = finish(gw, s["session_id"])
    assert summary["segments"] == 1 and summary["rejects"] == []
    assert summary["samples"][0]["trainable_tokens"] == 2 * len(fe.reply)


def test_context_length_exceeded_is_openais_error_and_changes_no_session_state(gw: str) -> None:
    s = session(gw)
    long = [{"role": "user", "content": "word " * 400}]
    with pytest.raises(openai.BadRequestError) as err:
        client(s).chat.completions.create(model="m", messages=long)
    assert err.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as err:
        client(s).chat.completions.create(model="m", messages=USER, max_tokens=1000)
    assert err.value.code == "context_length_exceeded"
    # A refused request is not a turn that ran out of context: the conversation then goes on
    # and finishes normally, and its sample is `completed`, not `truncated`.
    client(s).chat.completions.create(model="m", messages=USER)
    summary = finish(gw, s["session_id"])
    assert summary["termination_reason"] is None and summary["rejects"] == []
    doc = httpx.get(gw + f"/v1/trajectories/{summary['samples'][0]['cursor']}", headers=A).json()
    assert doc["status"] == "completed"


def _rewrite(c: openai.OpenAI) -> None:
    c.chat.completions.create(model="m", messages=USER)
    summary = [{"role": "user", "content": "(summary of earlier work)"}, {"role": "user", "content": "go on"}]
    c.chat.completions.create(model="m", messages=summary)


def test_policy_segment_opens_a_new_sample_with_its_cause(gw: str) -> None:
    s = session(gw, policy="segment")
    _rewrite(client(s))
    summary = finish(gw, s["session_id"])
    assert summary["segments"] == 2 and len(summary["samples"]) == 2
    doc = httpx.get(gw + f"/v1/trajectories/{summary['samples'][1]['cursor']}", headers=A).json()
    assert doc["metadata"]["segment_cause"] == "rewrite"
    assert doc["metadata"]["segment_cause_detail"] == "history rewritten at message 0 (role 'user')"
    assert [c["cause"] for c in summary["segment_causes"]] == ["start", "rewrite"]
    assert doc["rollout_id"] == s["rollout_id"]


def test_policy_passthrough_serves_on_and_rejects_the_samples(gw: str) -> None:
    s = session(gw, policy="passthrough")
    _rewrite(client(s))
    assert info(gw, s["session_id"])["capturing"] is False
    summary = finish(gw, s["session_id"])
    assert summary["samples"] == [] and summary["rejects"][0]["reason"] == "capture_invalid"


def test_policy_refuse_answers_409_and_changes_nothing(gw: str) -> None:
    s = session(gw, policy="refuse")
    with pytest.raises(openai.ConflictError):
        _rewrite(client(s))
    summary = finish(gw, s["session_id"])
    assert summary["segments"] == 1 and len(summary["samples"]) == 1


def test_a_retried_request_replaces_the_turn(gw: str, fe: FaultEngine) -> None:
    s = session(gw)
    c = client(s)
    c.chat.completions.create(model="m", messages=USER)
    c.chat.completions.create(model="m", messages=USER)  # the agent lost the reply and retried
    assert info(gw, s["session_id"])["turns"] == 2
    summary = finish(gw, s["session_id"])
    assert summary["segments"] == 1 and summary["samples"][0]["trainable_tokens"] == len(fe.reply)


def test_finish_is_idempotent_and_closes_the_session(gw: str) -> None:
    s = session(gw)
    client(s).chat.completions.create(model="m", messages=USER)
    first = finish(gw, s["session_id"])
    assert finish(gw, s["session_id"], reward=0.0) == first
    with pytest.raises(openai.ConflictError):
        client(s).chat.completions.create(model="m", messages=USER)


def test_delete_forgets_the_session(gw: str) -> None:
    s = session(gw)
    assert httpx.delete(gw + f"/v1/sessions/{s['session_id']}", headers=A).status_code == 200
    assert httpx.get(gw + f"/v1/sessions/{s['session_id']}", headers=A).status_code == 404


def test_completions_extend_the_text_and_record_one_series(gw: str, fe: FaultEngine) -> None:
    s = session(gw)
    c = client(s)
    first = c.completions.create(model="m", prompt="Once upon a time")
    assert first.choices[0].text == "Hello there."
    c.completions.create(model="m", prompt="Once upon a time" + first.choices[0].text + " And then")
    summary = finish(gw, s["session_id"])
    assert summary["segments"] == 1 and summary["samples"][0]["trainable_tokens"] == 2 * len(fe.reply)
    streamed = "".join(
        ch.choices[0].text
        for ch in client(session(gw)).completions.create(model="m", prompt="x", stream=True)
        if ch.choices
    )
    assert streamed == "Hello there."


def test_a_client_that_leaves_aborts_the_engine_request(gw: str, fe: FaultEngine) -> None:
    s = session(gw)
    fe.aborted.clear()
    fe.script[:] = ["slow"]
    auth = {"Authorization": f"Bearer {s['api_key']}"}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(s["base_url"] + "/chat/completions", json={"messages": USER}, headers=auth, timeout=0.5)
    rid = fe.calls[-1]["rid"]
    for _ in range(50):
        if rid in fe.aborted:
            break
        time.sleep(0.05)
    assert rid in fe.aborted
    state = info(gw, s["session_id"])
    assert state["tokens"] == 0 and state["failed_turns"] == 1


def test_a_turn_ended_by_another_eos_is_closed_by_the_template(gw: str, fe: FaultEngine) -> None:
    s = session(gw)
    c = client(s)
    fe.script[:] = ["other_eos"]
    c.chat.completions.create(model="m", messages=USER)
    history = [*USER, {"role": "assistant", "content": "Hello there."}, {"role": "user", "content": "more"}]
    c.chat.completions.create(model="m", messages=history)
    summary = finish(gw, s["session_id"])
    doc = httpx.get(gw + f"/v1/trajectories/{summary['samples'][0]['cursor']}", headers=A).json()
    tokens, n = doc["tokens"], doc["response_length"]
    p = len(tokens) - n
    first_end = p + len(fe.reply)
    # The sampled <|endoftext|> stays (mask 1); the template's <|im_end|> follows it (mask 0).
    assert tokens[first_end - 1] == fe.other_eos and doc["loss_mask"][len(fe.reply) - 1] == 1
    assert tokens[first_end] == fe.eos and doc["loss_mask"][len(fe.reply)] == 0


RUN = {
    "name": "run",
    "description": "Run a command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
}
CUT = '<tool_call>\n{"name": "run", "arguments": {"command": "echo hi'  # then the stop token


def test_a_streamed_call_cut_inside_its_arguments_is_echoed_into_the_same_sample(
    gw: str, fe: FaultEngine, tiny_qwen3: Any
) -> None:
    """The model stops inside a call's arguments (tiny-agent did under Claude Code): the agent was
    streamed the call, runs or refuses it and echoes it by id; that extends the sample, on Chat and
    Messages, and the non-streamed reply holds the same call."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    saved, fe.reply = fe.reply, [*tok.encode(CUT, add_special_tokens=False), fe.eos]
    n = len(fe.reply)
    try:
        s = session(gw)
        c = client(s)
        tools = [{"type": "function", "function": RUN}]
        chunks = list(c.chat.completions.create(model="m", messages=USER, tools=tools, stream=True))
        deltas = [tc for ch in chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or []]
        content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        call_id, args = deltas[0].id, "".join(d.function.arguments or "" for d in deltas)
        assert deltas[0].function.name == "run" and args == '{"command": "echo hi' and content == ""
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"
        call = {"id": call_id, "type": "function", "function": {"name": "run", "arguments": args}}
        history = [*USER, {"role": "assistant", "content": None, "tool_calls": [call]}]
        history.append({"role": "tool", "tool_call_id": call_id, "content": "error: arguments are not JSON"})
        reply = c.chat.completions.create(model="m", messages=history, tools=tools)
        assert reply.choices[0].message.tool_calls[0].function.arguments == args  # not streamed: the same
        assert not reply.choices[0].message.content

        # Messages, as Claude Code echoes the call it could not parse.
        auth = {"x-api-key": s["api_key"]}
        body = {"model": "m", "max_tokens": 64, "tools": [{"name": "run", "input_schema": RUN["parameters"]}]}
        first = {**body, "messages": [{"role": "user", "content": "again"}]}
        m = httpx.post(gw + "/v1/messages", json={**first, "stream": True}, headers=auth, timeout=30)
        events = [orjson.loads(line[6:]) for line in m.text.splitlines() if line.startswith("data: ")]
        starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
        assert [b["type"] for b in starts] == ["tool_use"], starts  # no text block repeats the call
        echoed = {"type": "tool_use", "id": starts[0]["id"], "name": "run",
                  "input": {"__unparsedToolInput": {"raw": '{"command": "echo hi', "len": 19}}}  # fmt: skip
        result = {"type": "tool_result", "tool_use_id": echoed["id"], "content": "not JSON", "is_error": True}
        later = [*first["messages"], {"role": "assistant", "content": [echoed]}]
        later.append({"role": "user", "content": [result]})
        m2 = httpx.post(gw + "/v1/messages", json={**body, "messages": later}, headers=auth, timeout=30)
        assert m2.status_code == 200, m2.text
        assert [b["type"] for b in m2.json()["content"]] == ["tool_use"]
        assert m2.json()["content"][0]["input"] == {}  # `input` must be an object
        summary = finish(gw, s["session_id"])
    finally:
        fe.reply = saved
    # Two conversations (Chat, Messages), each one sample of two turns: no rewrite split either.
    assert summary["segments"] == 2, summary
    assert [x["trainable_tokens"] for x in summary["samples"]] == [2 * n] * 2
