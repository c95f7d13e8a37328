"""The Messages surface driven by the real `anthropic` SDK through a capture session.

`rlgw serve` in front of the recording proxy and the embedded engine on tiny-qwen3 (the
harness of `tests/support/e2e.py`): each tool loop is recorded as one sample and checked token for token
(mask-1 = the engine's ids, mask-0 = the template's full-render increments, logprobs = the
engine's teacher-forced logprobs). Errors answer in Anthropic's format.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from rlgw.gateway.surfaces.anthropic import translate as at
from rlgw.gateway.surfaces.anthropic.api import turn_params
from tests.support import fixture_prompts as fp
from tests.support.e2e import Run, Stack, check_sample, echo, finish, open_session, stored
from tests.support.surface_e2e import chat_reply, result_text

pytestmark = pytest.mark.slow

TOOLS = [
    {"name": f["name"], "description": f["description"], "input_schema": f["parameters"]}
    for f in (t["function"] for t in fp.TOOLS)
]


def as_chat(reply: Any) -> Any:
    """An Anthropic reply as `check_sample` reads replies."""
    text = "".join(b.text for b in reply.content if b.type == "text")
    thinking = "".join(b.thinking for b in reply.content if b.type == "thinking")
    calls = [(b.id, b.name, json.dumps(b.input)) for b in reply.content if b.type == "tool_use"]
    return chat_reply(text, thinking, calls)


def tool_loop(
    client: anthropic.Anthropic, *, stream: bool, thinking: bool, followups: list[str], events: list[str]
) -> tuple[Run, list[Any]]:
    """The SDK's documented tool loop; the same conversation is kept in chat messages beside it."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": fp.WEATHER[0]["content"]}]
    chat: list[dict[str, Any]] = list(fp.WEATHER)
    run, replies = Run(), []
    switch = {"type": "enabled", "budget_tokens": 512} if thinking else {"type": "disabled"}
    for _ in range(8):
        run.requests.append(list(chat))
        kwargs: dict[str, Any] = {"model": "m", "max_tokens": 256, "messages": messages, "tools": TOOLS}
        # Greedy: recent SDKs dropped `temperature` from the signature; the API still takes it.
        kwargs |= {"extra_body": {"temperature": 0.0}, "thinking": switch, "metadata": {"user_id": "u-1"}}
        if stream:
            with client.messages.stream(**kwargs) as s:
                events += [e.type for e in s]
                reply = s.get_final_message()
        else:
            reply = client.messages.create(**kwargs)
        replies.append(reply)
        run.replies.append(as_chat(reply))
        messages.append({"role": "assistant", "content": reply.content})
        chat.append(echo(run.replies[-1], reserialize=False, drop_reasoning=False))
        uses = [b for b in reply.content if b.type == "tool_use"]
        if uses:
            results = [(b.id, result_text(b.name, b.input)) for b in uses]
            messages.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": i, "content": r} for i, r in results],
                }
            )
            chat += [{"role": "tool", "tool_call_id": i, "content": r} for i, r in results]
        elif followups:
            messages.append({"role": "user", "content": followups[0]})
            chat.append({"role": "user", "content": followups.pop(0)})
        else:
            break
    return run, replies


def recorded(st: Stack, sid: str, run: Run, kw: dict[str, Any]) -> dict[str, Any]:
    summary = finish(st, sid)
    assert summary["segments"] == 1 and summary["rejects"] == []
    doc = stored(st, summary["samples"][0]["cursor"])
    check_sample(st, doc, run, fp.TOOLS, kw)
    return doc


def test_messages_create_tool_loop_is_one_token_exact_sample(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="messages-create")
    # The key route: the SDK sends the session key as x-api-key to {gateway}/v1/messages.
    client = anthropic.Anthropic(base_url=qwen3.gateway, api_key=s["api_key"], max_retries=0)
    run, replies = tool_loop(
        client, stream=False, thinking=False, followups=["What is the weather in Berlin?"], events=[]
    )
    reasons = [r.stop_reason for r in replies]
    assert len(reasons) >= 3 and reasons[0] == "tool_use" and reasons[-1] == "end_turn"
    ids = [b.id for r in replies for b in r.content if b.type == "tool_use"]
    assert ids and all(i.startswith("call_") for i in ids)  # the ids the gateway minted
    assert replies[0].usage.input_tokens > 0 and replies[0].usage.output_tokens > 0
    recorded(qwen3, s["session_id"], run, {"enable_thinking": False})


def test_messages_stream_tool_loop_with_thinking_is_one_token_exact_sample(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="messages-stream")
    client = anthropic.Anthropic(base_url=s["base_url"].removesuffix("/v1"), api_key="unused", max_retries=0)
    events: list[str] = []
    run, replies = tool_loop(
        client, stream=True, thinking=True, followups=["What is the weather in Berlin?"], events=events
    )
    assert len(replies) >= 3
    assert any(b.type == "thinking" and b.thinking for r in replies for b in r.content), (
        "the fixture reasons first"
    )
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(
        events
    )
    assert replies[-1].usage.input_tokens > 0
    # The echoed thinking blocks (and tool_use inputs re-serialized by the SDK) cause no fork.
    recorded(qwen3, s["session_id"], run, {"enable_thinking": True})


def test_count_tokens_is_the_rendered_prompt_length(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="count")
    client = anthropic.Anthropic(base_url=qwen3.gateway, api_key=s["api_key"], max_retries=0)
    messages = [{"role": "user", "content": fp.WEATHER[0]["content"]}]
    got = client.messages.count_tokens(
        model="m", messages=messages, tools=TOOLS, thinking={"type": "disabled"}
    )
    prompt = qwen3.tokenizer.apply_chat_template(
        fp.WEATHER, tools=fp.TOOLS, add_generation_prompt=True, tokenize=False, enable_thinking=False
    )
    assert got.input_tokens == len(qwen3.tokenizer.encode(prompt, add_special_tokens=False))


def test_errors_answer_in_anthropics_format(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="errors")
    client = anthropic.Anthropic(base_url=qwen3.gateway, api_key=s["api_key"], max_retries=0)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": [image]}])
    assert bad.value.body["type"] == "error" and bad.value.body["error"]["type"] == "invalid_request_error"
    assert "'image' blocks" in bad.value.body["error"]["message"]
    r = httpx.post(
        qwen3.gateway + "/v1/messages",
        headers={"x-api-key": s["api_key"]},
        json={"messages": [{"role": "user", "content": "hi"}]},
    )
    assert (
        r.status_code == 400 and r.json()["type"] == "error" and "max_tokens" in r.json()["error"]["message"]
    )
    stranger = anthropic.Anthropic(base_url=qwen3.gateway, api_key="sk-nobody", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as auth:
        stranger.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert auth.value.body["error"]["type"] == "authentication_error"
    finish(qwen3, s["session_id"])


def test_switching_from_chat_to_messages_opens_a_mode_switch_segment(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="mixed")
    chat = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
    first = chat.chat.completions.create(model="m", messages=fp.PLAIN, temperature=0, max_tokens=32)
    client = anthropic.Anthropic(base_url=qwen3.gateway, api_key=s["api_key"], max_retries=0)
    history = [*fp.PLAIN, {"role": "assistant", "content": first.choices[0].message.content}, *fp.WEATHER]
    client.messages.create(model="m", max_tokens=32, messages=history, extra_body={"temperature": 0})
    summary = finish(qwen3, s["session_id"])
    assert [c["cause"] for c in summary["segment_causes"]] == ["start", "mode_switch"]


CLAUDE_CODE = Path(__file__).parents[2] / "fixtures" / "claude_code" / "first_request.json"


def claude_code_request() -> dict[str, Any]:
    """Claude Code's captured first request (tests/gateway/surfaces/test_mid_system.py), cut down to fit
    tiny-qwen3's 8k context: two of its tools and shorter texts, its shape unchanged."""
    body = json.loads(CLAUDE_CODE.read_text())
    body["tools"] = [t for t in body["tools"] if t["name"] in ("Bash", "Write")]
    for block in [*body["system"], *(b for m in body["messages"] for b in m["content"])]:
        block["text"] = block["text"][:1200]
    return body


def test_claude_codes_first_request_retries_on_the_context_wording_and_records(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="claude-code")
    client = anthropic.Anthropic(base_url=s["base_url"].removesuffix("/v1"), api_key="k", max_retries=0)
    body = claude_code_request()
    betas = {"anthropic-beta": "claude-code-20250219,mid-conversation-system-2026-04-07"}
    # Sent as Claude Code sends it (fields this SDK release has no argument for go as they are).
    rest = {k: v for k, v in body.items() if k not in ("model", "max_tokens", "messages", "stream")}
    with pytest.raises(anthropic.BadRequestError) as over:
        client.messages.create(
            model=body["model"],
            max_tokens=body["max_tokens"],
            messages=body["messages"],
            stream=True,
            extra_body=rest,
            extra_headers=betas,
        )
    # Claude Code's own pattern: it retries with max_tokens = C - P - 1000 (floor 3000).
    found = re.search(
        r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)", over.value.message
    )
    assert found and int(found[2]) == 128000 and int(found[3]) == 8192
    body["max_tokens"] = 48  # short for the test: the retry itself is what is checked
    body["temperature"] = rest["temperature"] = 0.0
    with client.messages.stream(
        model=body["model"], max_tokens=48, messages=body["messages"], extra_body=rest, extra_headers=betas
    ) as stream:
        reply = stream.get_final_message()
    assert reply.usage.output_tokens > 0
    params = turn_params(at.MessagesRequest.model_validate(body))
    assert [m["role"] for m in params.messages] == ["system", "user", "system"]
    summary = finish(qwen3, s["session_id"])
    assert summary["segments"] == 1 and summary["rejects"] == []
    doc = stored(qwen3, summary["samples"][0]["cursor"])
    assert int(found[1]) == len(doc["tokens"]) - doc["response_length"]
    run = Run([params.messages], [as_chat(reply)])
    check_sample(qwen3, doc, run, params.tools, params.template_kwargs)
