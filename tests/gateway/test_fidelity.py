"""Gateway fidelity: what the engine is fed, what the agent is served and what the sample says
agree with what really happened (issue: ten defects found from outside, and what real clients send).

Each test drives the real gateway process over HTTP with the real `openai` client against a
scripted engine that records every `/generate` body it receives.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.test_api import USER, A, client, finish, info, session
from tests.support.fault_engine import FaultEngine

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _stored(gw: str, cursor: int) -> dict[str, Any]:
    return httpx.get(gw + f"/v1/trajectories/{cursor}", headers=A).json()


def _segments(summary: dict[str, Any]) -> list[str]:
    return [c["cause"] for c in summary["segment_causes"]]


def test_completions_then_chat_opens_a_mode_switch_segment(gw: str, fe: FaultEngine) -> None:
    s = session(gw)
    c = client(s)
    c.completions.create(model="m", prompt="Once upon a time", max_tokens=4)
    reply = c.chat.completions.create(model="m", messages=USER)
    fed = fe.calls[-1]["input_ids"]
    # The chat turn is fed the chat render alone, not the completion text followed by it.
    assert reply.usage.prompt_tokens == len(fed)
    assert len(fed) < len(fe.calls[0]["input_ids"]) + 20
    summary = finish(gw, s["session_id"])
    assert _segments(summary) == ["start", "mode_switch"] and len(summary["samples"]) == 2


def test_chat_then_completions_is_a_mode_switch_too(gw: str) -> None:
    s = session(gw)
    c = client(s)
    c.chat.completions.create(model="m", messages=USER)
    c.completions.create(model="m", prompt="Once upon a time", max_tokens=4)
    assert _segments(finish(gw, s["session_id"])) == ["start", "mode_switch"]


def test_a_changed_tool_list_opens_a_tools_changed_segment(gw: str, fe: FaultEngine) -> None:
    s = session(gw)
    c = client(s)
    first = c.chat.completions.create(model="m", messages=USER, tools=[TOOL])
    history = [
        *USER,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": "more"},
    ]
    # The same tools with another key order are no change.
    reordered = {"function": dict(reversed(list(TOOL["function"].items()))), "type": "function"}
    c.chat.completions.create(model="m", messages=history, tools=[reordered])
    assert info(gw, s["session_id"])["segments"] == 1
    other = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    history2 = [
        *history,
        {"role": "assistant", "content": "Hello there."},
        {"role": "user", "content": "again"},
    ]
    c.chat.completions.create(model="m", messages=history2, tools=[TOOL, other])
    # The new segment's prompt is the full render of the request, with the new tool list.
    assert len(fe.calls[-1]["input_ids"]) > len(fe.calls[-2]["input_ids"])
    summary = finish(gw, s["session_id"])
    assert _segments(summary) == ["start", "tools_changed"]


@pytest.mark.parametrize(
    "key", ["tools", "messages", "add_generation_prompt", "previous_ended_with_eos", "tokenize"]
)
def test_template_kwargs_that_collide_with_the_renderer_are_400s(gw: str, key: str) -> None:
    s = session(gw)
    with pytest.raises(openai.BadRequestError) as err:
        client(s).chat.completions.create(
            model="m", messages=USER, extra_body={"chat_template_kwargs": {key: True}}
        )
    assert key in str(err.value) and err.value.body["param"] == f"chat_template_kwargs.{key}"


def test_a_turn_waiting_while_finish_runs_is_refused_not_served_unrecorded(gw: str, fe: FaultEngine) -> None:
    s = session(gw)
    c = client(s)
    fe.script[:] = ["slow"]
    results: dict[str, Any] = {}

    def call(name: str, messages: list[dict[str, Any]]) -> None:
        try:
            results[name] = c.chat.completions.create(model="m", messages=messages)
        except openai.APIError as exc:
            results[name] = exc

    first = threading.Thread(target=call, args=("first", USER))
    first.start()
    time.sleep(0.5)
    second = threading.Thread(target=call, args=("second", [{"role": "user", "content": "other"}]))
    second.start()
    time.sleep(0.3)
    summary = finish(gw, s["session_id"])
    first.join()
    second.join()
    assert isinstance(results["second"], openai.ConflictError)
    served = [r for r in results.values() if not isinstance(r, Exception)]
    # Whatever was served before finish is in the sample; nothing was served after it.
    assert summary["trainable_tokens"] == len(served) * len(fe.reply)


def test_streamed_chunks_carry_the_logprobs_of_their_tokens(gw: str, fe: FaultEngine) -> None:
    s = session(gw)
    c = client(s)
    plain = c.chat.completions.create(model="m", messages=USER, logprobs=True)
    s2 = session(gw)
    got = []
    for chunk in client(s2).chat.completions.create(model="m", messages=USER, logprobs=True, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            got += chunk.choices[0].logprobs.content
    assert [(e.token, e.logprob) for e in got] == [
        (e.token, e.logprob) for e in plain.choices[0].logprobs.content
    ]
    assert len(got) == len(fe.reply)


def test_streamed_completions_carry_logprobs(gw: str, fe: FaultEngine) -> None:
    s = session(gw)
    lps: list[float] = []
    for chunk in client(s).completions.create(model="m", prompt="Hi", max_tokens=8, logprobs=0, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            lps += chunk.choices[0].logprobs.token_logprobs
    assert lps == [-0.5] * len(fe.reply)


@pytest.mark.parametrize("policy", ["segment", "passthrough"])
def test_a_rewritten_request_that_fails_changes_nothing(gw: str, fe: FaultEngine, policy: str) -> None:
    s = session(gw, policy=policy)
    c = client(s)
    c.chat.completions.create(model="m", messages=USER)
    rewritten = [{"role": "user", "content": "(summary)"}, {"role": "user", "content": "go on"}]
    fe.script[:] = ["400"]
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="m", messages=rewritten)
    with pytest.raises(openai.BadRequestError):  # over the context: refused before the engine
        c.chat.completions.create(model="m", messages=rewritten, max_tokens=100_000)
    doc = info(gw, s["session_id"])
    assert doc["segments"] == 1 and doc["capturing"] is True and doc["failed_turns"] == 2
    summary = finish(gw, s["session_id"])
    assert len(summary["samples"]) == 1 and summary["rejects"] == []


@pytest.mark.parametrize(
    "resent",
    [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "user", "content": "hi", "name": None},
        {"role": "user", "content": "hi", "name": ""},
    ],
)
def test_content_shape_is_not_content(gw: str, resent: dict[str, Any]) -> None:
    s = session(gw)
    c = client(s)
    first = c.chat.completions.create(model="m", messages=USER)
    history = [
        resent,
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "more"},
    ]
    c.chat.completions.create(model="m", messages=history)
    assert info(gw, s["session_id"])["segments"] == 1


def test_a_list_with_different_text_is_a_rewrite(gw: str) -> None:
    s = session(gw)
    c = client(s)
    first = c.chat.completions.create(model="m", messages=USER)
    history = [
        {"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]},
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "more"},
    ]
    c.chat.completions.create(model="m", messages=history)
    assert info(gw, s["session_id"])["segments"] == 2


def test_a_retry_replaces_the_turn_and_says_so(gw: str, fe: FaultEngine) -> None:
    s = session(gw)
    c = client(s)
    c.chat.completions.create(model="m", messages=USER)
    c.chat.completions.create(model="m", messages=USER)
    summary = finish(gw, s["session_id"])
    assert summary["segments"] == 1
    doc = _stored(gw, summary["samples"][0]["cursor"])
    assert [r["turn"] for r in doc["metadata"]["replaced_turns"]] == [0]


def test_a_concurrent_duplicate_becomes_its_own_segment(gw: str, fe: FaultEngine) -> None:
    s = session(gw)
    c = client(s)
    fe.script[:] = ["slow", "ok"]
    replies: list[Any] = []
    threads = [
        threading.Thread(target=lambda: replies.append(c.chat.completions.create(model="m", messages=USER)))
    ]
    threads[0].start()
    time.sleep(0.5)  # the first is generating (3 s) when the identical second arrives
    threads.append(
        threading.Thread(target=lambda: replies.append(c.chat.completions.create(model="m", messages=USER)))
    )
    threads[1].start()
    for t in threads:
        t.join()
    assert len(replies) == 2
    summary = finish(gw, s["session_id"])
    # Both replies were delivered in full: both are kept, the second in a segment of its own.
    assert _segments(summary) == ["start", "concurrent"] and len(summary["samples"]) == 2


def test_capture_sessions_own_sampling_and_record_what_the_agent_asked(gw: str, fe: FaultEngine) -> None:
    s = session(gw, sampling={"temperature": 1.0})
    client(s).chat.completions.create(model="m", messages=USER, temperature=0.0, top_p=1.0, seed=3)
    sp = fe.calls[-1]["sampling_params"]
    assert sp["temperature"] == 1.0 and "top_p" not in sp and "sampling_seed" not in sp
    summary = finish(gw, s["session_id"])
    doc = _stored(gw, summary["samples"][0]["cursor"])
    assert doc["metadata"]["agent_sampling"] == [
        {"turn": 0, "temperature": 0.0, "top_p": 1.0, "sampling_seed": 3}
    ]


def test_eval_sessions_and_request_precedence_apply_the_agents_sampling(gw: str, fe: FaultEngine) -> None:
    for body in ({"mode": "eval"}, {"sampling_precedence": "request", "sampling": {"temperature": 1.0}}):
        s = session(gw, **body)
        client(s).chat.completions.create(model="m", messages=USER, temperature=0.0, top_p=0.5)
        sp = fe.calls[-1]["sampling_params"]
        assert sp["temperature"] == 0.0 and sp["top_p"] == 0.5


@pytest.mark.parametrize(
    ("response_format", "expected"),
    [
        ({"type": "json_object"}, '{"type": "object"}'),
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "w", "schema": {"type": "object", "required": ["a"]}},
            },
            '{"type":"object","required":["a"]}',
        ),
    ],
)
def test_response_format_reaches_the_engine_as_sglang_json_schema(
    gw: str, fe: FaultEngine, response_format: dict[str, Any], expected: str
) -> None:
    s = session(gw)
    client(s).chat.completions.create(model="m", messages=USER, response_format=response_format)
    assert fe.calls[-1]["sampling_params"]["json_schema"] == expected


def test_a_json_schema_without_schema_names_the_param(gw: str) -> None:
    s = session(gw)
    with pytest.raises(openai.BadRequestError) as err:
        client(s).chat.completions.create(
            model="m", messages=USER, response_format={"type": "json_schema", "json_schema": {"name": "x"}}
        )
    assert err.value.body["param"] == "response_format"


@pytest.mark.parametrize(
    ("method", "path", "status"), [("GET", "/v1/nowhere", 404), ("GET", "/v1/chat/completions", 405)]
)
def test_unknown_routes_and_methods_answer_in_openai_format(
    gw: str, method: str, path: str, status: int
) -> None:
    r = httpx.request(method, gw + path)
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and path in err["message"]


def test_health_counts_open_and_finished_sessions(gw: str) -> None:
    s = session(gw)
    before = httpx.get(gw + "/health").json()["sessions"]
    finish(gw, s["session_id"])
    after = httpx.get(gw + "/health").json()["sessions"]
    assert after["open"] == before["open"] - 1 and after["finished"] == before["finished"] + 1


def test_an_agent_stated_cause_names_the_segment(gw: str) -> None:
    s = session(gw)
    c = client(s)
    c.chat.completions.create(model="m", messages=USER)
    c.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "(summary)"}],
        extra_headers={"X-Rlgw-Event": "compaction"},
    )
    assert _segments(finish(gw, s["session_id"])) == ["start", "compaction"]


def test_metrics_count_segments_by_cause(gw: str) -> None:
    def count() -> float:
        for line in httpx.get(gw + "/metrics").text.splitlines():
            if line.startswith('rlgw_segments_total{cause="tools_changed"}'):
                return float(line.split()[-1])
        return 0.0

    before = count()
    s = session(gw)
    c = client(s)
    first = c.chat.completions.create(model="m", messages=USER, tools=[TOOL])
    history = [
        *USER,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": "x"},
    ]
    c.chat.completions.create(model="m", messages=history)  # the tools are gone: a new segment
    assert count() == before + 1
