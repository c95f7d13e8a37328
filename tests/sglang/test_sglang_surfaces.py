"""The gateway's surfaces on the real SGLang, with the same assertions as the rest of the suite.

The end-to-end tests of the four surfaces and of the `tool_choice` structural tag are imported from
the gateway's own modules and run here with their `qwen3` stack being the session's SGLang stack:
streamed Messages and Responses tool loops, one token-exact sample each; `tool_choice` constrained
through SGLang's grammar backend (xgrammar). The tests written here add what only a real engine
shows: `response_format`/`regex`/`ebnf` honoured by SGLang, a streamed completion carrying SGLang's
ids, an agent that leaves aborting SGLang's request, and SGLang's radix cache on a growing loop.
"""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.parsing.test_tool_choice_grammar import (
    test_anthropic_tool_choice_tool,
    test_chat_named_function_makes_a_model_that_answers_in_text_call_it,
    test_chat_required_streamed_with_thinking,
    test_responses_named_function,
)
from tests.gateway.surfaces.test_anthropic_api import (
    test_messages_stream_tool_loop_with_thinking_is_one_token_exact_sample,
)
from tests.gateway.surfaces.test_responses_api import (
    test_responses_stream_chained_by_previous_response_id_is_one_token_exact_sample,
)
from tests.support import fixture_prompts as fp
from tests.support.e2e import Stack, check_engine_spans, finish, open_session, stored

REUSED = (
    test_messages_stream_tool_loop_with_thinking_is_one_token_exact_sample,
    test_responses_stream_chained_by_previous_response_id_is_one_token_exact_sample,
    test_anthropic_tool_choice_tool,
    test_chat_named_function_makes_a_model_that_answers_in_text_call_it,
    test_chat_required_streamed_with_thinking,
    test_responses_named_function,
)
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture
def qwen3(sglang_qwen3: Stack) -> Stack:
    """The imported gateway tests' stack: here, the real SGLang's."""
    return sglang_qwen3


def _client(s: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)


def _one_sample(st: Stack, sid: str) -> dict[str, Any]:
    summary = finish(st, sid)
    assert summary["rejects"] == [] and len(summary["samples"]) == 1
    doc = stored(st, summary["samples"][0]["cursor"])
    check_engine_spans(st, doc)  # mask 1 = SGLang's ids and logprobs, fed the series before them
    return doc


@pytest.mark.parametrize(
    ("constraint", "accepts"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": {
                "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                "required": ["city"], "additionalProperties": False}}}},
            # JSON admits whitespace before the closing brace, and the tiny model may spend its
            # tokens on it: the closed object, or the object cut in that whitespace.
            lambda text: re.fullmatch(r'\{\s*"city"\s*:\s*"[^"]{0,12}"\s*(\}\s*)?', text),
        ),
        ({"regex": "(yes|no), [a-z]{3,8}\\."}, lambda text: re.fullmatch(r"(yes|no), [a-z]{3,8}\.", text)),
        ({"ebnf": 'root ::= "Paris" | "Lyon" | "Nice"'}, lambda text: text in ("Paris", "Lyon", "Nice")),
    ],
    ids=["response_format", "regex", "ebnf"],
)  # fmt: skip
def test_sglangs_grammar_backend_constrains_the_recorded_turn(
    sglang_qwen3: Stack, constraint: dict[str, Any], accepts: Any
) -> None:
    s = open_session(sglang_qwen3, task_id="constrained")
    r = _client(s).chat.completions.create(
        model="m", messages=fp.PLAIN, temperature=0.0, max_tokens=40, extra_body={**NO_THINK, **constraint}
    )
    text = r.choices[0].message.content
    assert accepts(text), text
    doc = _one_sample(sglang_qwen3, s["session_id"])
    assert sglang_qwen3.tokenizer.decode(doc["tokens"][-doc["response_length"] :]).startswith(text)


def test_a_streamed_completion_is_sglangs_ids(sglang_qwen3: Stack) -> None:
    s = open_session(sglang_qwen3, task_id="completions-stream")
    chunks = _client(s).completions.create(
        model="m", prompt="The weather in Paris is", max_tokens=12, temperature=0.0, stream=True
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    doc = _one_sample(sglang_qwen3, s["session_id"])
    assert text and sglang_qwen3.tokenizer.decode(doc["tokens"][-doc["response_length"] :]) == text


def test_an_agent_that_leaves_aborts_sglangs_request(sglang_qwen3: Stack) -> None:
    s = open_session(sglang_qwen3, task_id="leaves")
    before = set(sglang_qwen3.recorder.by_rid)
    body = {"model": "m", "messages": fp.PLAIN, "max_tokens": 3000, "ignore_eos": True, "temperature": 1.0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            s["base_url"] + "/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {s['api_key']}"},
            timeout=1.5,
        )
    deadline = time.monotonic() + 30
    while not (new := set(sglang_qwen3.recorder.by_rid) - before) and time.monotonic() < deadline:
        time.sleep(0.1)  # SGLang answers the aborted request when the gateway's abort reaches it
    (rid,) = new
    ex = sglang_qwen3.recorder.by_rid[rid]
    assert ex.finish_reason is not None and ex.finish_reason["type"] == "abort"
    assert len(ex.output_ids) < 3000
    state = httpx.get(sglang_qwen3.gateway + f"/v1/sessions/{s['session_id']}").json()
    assert state["tokens"] == 0 and state["failed_turns"] == 1


def test_a_growing_agent_loop_hits_sglangs_radix_cache(sglang_qwen3: Stack) -> None:
    s = open_session(sglang_qwen3, task_id="radix")
    client = _client(s)
    # An empty cache (other tests' prompts share the tools' system prompt): the first turn finds nothing.
    assert httpx.post(sglang_qwen3.engine + "/flush_cache", timeout=30).status_code == 200
    messages: list[Any] = list(fp.WEATHER)
    prompts, cached = [], []
    for followup in ("And in Berlin?", "And in Rome?", None):
        r = client.chat.completions.create(model="m", messages=messages, tools=fp.TOOLS, temperature=0.0,
                                           max_tokens=60, extra_body=NO_THINK)  # fmt: skip
        prompts.append(r.usage.prompt_tokens)
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))
        for call in msg.tool_calls or []:
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": fp.weather_result("Paris", "sunny", 20)}
            )
        if followup and not msg.tool_calls:
            messages.append({"role": "user", "content": followup})
    assert cached[0] == 0
    # Each later turn reuses at least the previous turn's whole prompt from SGLang's radix cache.
    for k in (1, 2):
        assert prompts[k - 1] <= cached[k] < prompts[k], (prompts, cached)
    _one_sample(sglang_qwen3, s["session_id"])
