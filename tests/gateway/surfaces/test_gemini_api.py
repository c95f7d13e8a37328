"""The Gemini surface driven by the real `google-genai` SDK through a capture session.

`rlgw serve` in front of the recording proxy and the embedded engine on tiny-qwen3 (the harness
of `tests/support/e2e.py`): each function-calling loop (functionCall -> functionResponse ->
answer) is recorded as one sample and checked token for token (mask-1 = the engine's ids,
mask-0 = the template's full-render increments, logprobs = the engine's teacher-forced
logprobs). Errors answer in Gemini's format.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from rlgw.gateway.surfaces.gemini import translate as gt
from tests.support import fixture_prompts as fp
from tests.support.e2e import Run, Stack, check_sample, echo, finish, open_session, stored
from tests.support.surface_e2e import chat_reply, result_text

pytestmark = pytest.mark.slow

# The fixture's tools, once as JSON schema and once as Gemini's own Schema (upper-case types).
DECLARATIONS = [
    types.FunctionDeclaration(
        name=f["name"], description=f["description"], parameters_json_schema=f["parameters"]
    )
    for f in (t["function"] for t in fp.TOOLS)
]
SCHEMA_DECLARATIONS = [
    types.FunctionDeclaration(
        name=f["name"], description=f["description"], parameters=types.Schema.model_validate(f["parameters"])
    )
    for f in (t["function"] for t in fp.TOOLS)
]
NO_RETRY = types.HttpRetryOptions(attempts=1)


def by_key(st: Stack, key: str, version: str = "v1beta") -> genai.Client:
    """A client that finds the session by its key (`x-goog-api-key`) at the gateway's root."""
    options = types.HttpOptions(base_url=st.gateway, api_version=version, retry_options=NO_RETRY)
    return genai.Client(api_key=key, http_options=options)


def by_path(session: dict[str, Any]) -> genai.Client:
    """A client whose base URL names the session (`{gateway}/s/{id}`), the SDK's default version."""
    base = session["base_url"].removesuffix("/v1")
    options = types.HttpOptions(base_url=base, retry_options=NO_RETRY)
    return genai.Client(api_key="unused", http_options=options)


def reply_of(parts: list[types.Part]) -> Any:
    """A model content's parts as `check_sample` reads replies."""
    text = "".join(p.text for p in parts if p.text and not p.thought)
    thinking = "".join(p.text for p in parts if p.text and p.thought)
    calls = [
        (p.function_call.id, p.function_call.name, json.dumps(p.function_call.args))
        for p in parts
        if p.function_call
    ]
    return chat_reply(text, thinking, calls)


def generate(
    client: genai.Client, contents: list[types.Content], config: types.GenerateContentConfig, *, stream: bool
) -> tuple[list[types.Part], list[types.GenerateContentResponse]]:
    """One turn: the model content's parts (a stream's text joined, as clients keep it) and the
    responses (one, or the stream's chunks)."""
    if not stream:
        response = client.models.generate_content(model="tiny", contents=contents, config=config)
        return list(response.candidates[0].content.parts), [response]
    chunks = list(client.models.generate_content_stream(model="tiny", contents=contents, config=config))
    parts = [p for c in chunks for p in c.candidates[0].content.parts or []]
    thought = "".join(p.text for p in parts if p.text and p.thought)
    text = "".join(p.text for p in parts if p.text and not p.thought)
    joined = [types.Part(text=thought, thought=True)] if thought else []
    joined += [types.Part(text=text)] if text else []
    return joined + [p for p in parts if p.function_call], chunks


def tool_loop(
    client: genai.Client,
    *,
    stream: bool,
    thinking: bool,
    followups: list[str],
    declarations: list[types.FunctionDeclaration] = DECLARATIONS,
    keep_ids: bool = True,
) -> tuple[Run, list[list[types.GenerateContentResponse]]]:
    """The SDK's documented manual function-calling loop, the conversation kept in chat messages
    beside it."""
    contents = [types.Content(role="user", parts=[types.Part(text=fp.WEATHER[0]["content"])])]
    chat: list[dict[str, Any]] = list(fp.WEATHER)
    budget = types.ThinkingConfig(thinking_budget=512, include_thoughts=True) if thinking else None
    config = types.GenerateContentConfig(
        temperature=0.0,
        max_output_tokens=256,
        tools=[types.Tool(function_declarations=declarations)],
        thinking_config=budget or types.ThinkingConfig(thinking_budget=0),
    )
    run, turns = Run(), []
    for _ in range(8):
        run.requests.append(list(chat))
        parts, responses = generate(client, contents, config, stream=stream)
        turns.append(responses)
        run.replies.append(reply_of(parts))
        calls = [p.function_call for p in parts if p.function_call]
        if not keep_ids:  # an agent that drops the ids Gemini's older API never sent
            parts = [
                types.Part(
                    function_call=types.FunctionCall(name=p.function_call.name, args=p.function_call.args)
                )
                if p.function_call
                else p
                for p in parts
            ]
        contents.append(types.Content(role="model", parts=parts))
        chat.append(echo(run.replies[-1], reserialize=False, drop_reasoning=False))
        if calls:
            answers = [(c, result_text(c.name, c.args)) for c in calls]
            contents.append(
                types.Content(
                    role="user",
                    parts=[
                        types.Part(
                            function_response=types.FunctionResponse(
                                id=c.id if keep_ids else None, name=c.name, response=json.loads(r)
                            )
                        )
                        for c, r in answers
                    ],
                )
            )
            chat += [{"role": "tool", "tool_call_id": c.id, "name": c.name, "content": r} for c, r in answers]
        elif followups:
            contents.append(types.Content(role="user", parts=[types.Part(text=followups[0])]))
            chat.append({"role": "user", "content": followups.pop(0)})
        else:
            break
    return run, turns


def recorded(
    st: Stack, sid: str, run: Run, kw: dict[str, Any], tools: list[dict[str, Any]] = fp.TOOLS
) -> dict[str, Any]:
    summary = finish(st, sid)
    assert summary["segments"] == 1 and summary["rejects"] == []
    doc = stored(st, summary["samples"][0]["cursor"])
    check_sample(st, doc, run, tools, kw)
    return doc


def test_generate_content_tool_loop_is_one_token_exact_sample(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="gemini-generate")
    run, turns = tool_loop(
        by_key(qwen3, s["api_key"]),
        stream=False,
        thinking=False,
        followups=["What is the weather in Berlin?"],
    )
    responses = [t[0] for t in turns]
    assert len(responses) >= 3 and responses[0].function_calls and not responses[-1].function_calls
    assert {r.candidates[0].finish_reason for r in responses} == {types.FinishReason.STOP}
    ids = [c.id for r in responses for c in r.function_calls or []]
    assert ids and all(i.startswith("call_") for i in ids)  # the ids the gateway minted
    doc = recorded(qwen3, s["session_id"], run, {"enable_thinking": False})
    # usageMetadata: the prompt the engine was fed and the tokens it sampled, per turn.
    spans = doc["metadata"]["engine_rids"]
    for response, rid in zip(responses, spans, strict=True):
        fed = qwen3.recorder.by_rid[rid]
        usage = response.usage_metadata
        assert usage.prompt_token_count == len(fed.input_ids)
        assert usage.candidates_token_count == len(fed.output_ids)
        assert usage.total_token_count == len(fed.input_ids) + len(fed.output_ids)


def test_stream_tool_loop_with_thoughts_is_one_token_exact_sample(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="gemini-stream")
    run, turns = tool_loop(
        by_path(s), stream=True, thinking=True, followups=["What is the weather in Berlin?"]
    )
    assert len(turns) >= 3 and all(len(chunks) >= 1 for chunks in turns)
    last = [chunks[-1] for chunks in turns]
    assert all(c.candidates[0].finish_reason == types.FinishReason.STOP for c in last)
    assert last[0].usage_metadata.thoughts_token_count, "the fixture reasons first"
    assert any(p.thought for chunks in turns for c in chunks for p in c.candidates[0].content.parts or [])
    assert len(turns[-1]) > 2, "text arrives as it is sampled, a chunk a piece"
    recorded(qwen3, s["session_id"], run, {"enable_thinking": True})


def test_echo_without_call_ids_keeps_the_sampled_tokens(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="gemini-no-ids")
    # Gemini's own Schema for the parameters (upper-case type names) renders the same tools.
    run, _ = tool_loop(
        by_key(qwen3, s["api_key"], "v1"),
        stream=False,
        thinking=False,
        followups=[],
        declarations=SCHEMA_DECLARATIONS,
        keep_ids=False,
    )
    assert len(run.replies) >= 2 and run.replies[0].tool_calls
    # The template renders the schema as the SDK sent it (its keys in the SDK's order), types lower-cased.
    sent = [d.model_dump(mode="json", exclude_none=True) for d in SCHEMA_DECLARATIONS]
    tools = gt.chat_tools([{"functionDeclarations": sent}])
    assert [t["function"]["parameters"]["type"] for t in tools] == ["object", "object"]
    doc = recorded(qwen3, s["session_id"], run, {"enable_thinking": False}, tools)
    assert {"turn": 0, "how": "calls"} in doc["metadata"]["echo_matches"]


def test_count_tokens_is_the_rendered_prompt_length(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="gemini-count")
    tools = [{"functionDeclarations": [d.model_dump(mode="json", exclude_none=True) for d in DECLARATIONS]}]
    request = {
        "contents": [{"role": "user", "parts": [{"text": fp.WEATHER[0]["content"]}]}],
        "tools": tools,
        "generationConfig": {"thinkingConfig": {"thinkingBudget": 0}},
    }
    url = s["base_url"].removesuffix("/v1") + "/v1beta/models/tiny:countTokens"
    r = httpx.post(url, json={"generateContentRequest": request})
    prompt = qwen3.tokenizer.apply_chat_template(
        fp.WEATHER, tools=fp.TOOLS, add_generation_prompt=True, tokenize=False, enable_thinking=False
    )
    assert r.status_code == 200 and r.json() == {"totalTokens": len(qwen3.tokenizer.encode(prompt))}
    # The SDK sends the contents alone, to the key route.
    plain = {"contents": request["contents"]}
    expected = httpx.post(url, json=plain).json()["totalTokens"]
    client = by_key(qwen3, s["api_key"])
    assert (
        client.models.count_tokens(model="tiny", contents=fp.WEATHER[0]["content"]).total_tokens == expected
    )
    bad = httpx.post(url, json={"contents": []})
    assert bad.status_code == 400 and bad.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert finish(qwen3, s["session_id"])["trainable_tokens"] == 0  # counting records nothing


def gemini_error(r: httpx.Response, code: int, status: str) -> str:
    assert r.status_code == code, r.text
    error = r.json()["error"]
    assert error["code"] == code and error["status"] == status
    return error["message"]


def test_errors_answer_in_geminis_format(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="gemini-errors")
    url = qwen3.gateway + "/v1beta/models/tiny:generateContent"
    key = {"x-goog-api-key": s["api_key"]}
    hi = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    client = by_key(qwen3, s["api_key"])
    with pytest.raises(genai_errors.ClientError) as many:
        client.models.generate_content(model="tiny", contents="hi", config={"candidate_count": 2})
    assert many.value.code == 400 and many.value.status == "INVALID_ARGUMENT"
    assert "candidateCount" in many.value.message
    r = httpx.post(url, content=b"{not json", headers=key)
    gemini_error(r, 400, "INVALID_ARGUMENT")
    assert "contents" in gemini_error(httpx.post(url, json={}, headers=key), 400, "INVALID_ARGUMENT")
    typed = {**hi, "generationConfig": {"temperature": "hot"}}
    assert "temperature" in gemini_error(httpx.post(url, json=typed, headers=key), 400, "INVALID_ARGUMENT")
    image = {
        "contents": [{"role": "user", "parts": [{"inlineData": {"mimeType": "image/png", "data": "AA=="}}]}]
    }
    assert "inlineData" in gemini_error(httpx.post(url, json=image, headers=key), 400, "INVALID_ARGUMENT")
    role = {"contents": [{"role": "system", "parts": [{"text": "hi"}]}]}
    gemini_error(httpx.post(url, json=role, headers=key), 400, "INVALID_ARGUMENT")
    stream = qwen3.gateway + "/v1beta/models/tiny:streamGenerateContent"
    assert "alt=sse" in gemini_error(httpx.post(stream, json=hi, headers=key), 400, "INVALID_ARGUMENT")
    gemini_error(httpx.post(url, json=hi, headers={"x-goog-api-key": "nobody"}), 401, "UNAUTHENTICATED")
    missing = qwen3.gateway + "/s/nope/v1beta/models/tiny:generateContent"
    gemini_error(httpx.post(missing, json=hi), 404, "NOT_FOUND")
    # The key as a query parameter (`?key=`) finds the session as the header does.
    # Greedy: sampled, the reply may end before its 4 tokens, depending on what the engine served before.
    short = {"maxOutputTokens": 4, "temperature": 0, "thinkingConfig": {"thinkingBudget": 0}}
    r = httpx.post(url, params={"key": s["api_key"]}, json={**hi, "generationConfig": short})
    assert r.status_code == 200 and r.json()["candidates"][0]["finishReason"] == "MAX_TOKENS"
    usage = r.json()["usageMetadata"]
    assert usage["candidatesTokenCount"] == 4 and usage["totalTokenCount"] == usage["promptTokenCount"] + 4
    summary = finish(qwen3, s["session_id"])
    assert summary["segments"] == 1  # only the one turn that was served recorded anything


def test_switching_from_chat_to_gemini_opens_a_mode_switch_segment(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="gemini-mixed")
    chat = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
    first = chat.chat.completions.create(model="m", messages=fp.PLAIN, temperature=0, max_tokens=32)
    contents = [
        types.Content(role="user", parts=[types.Part(text=fp.PLAIN[0]["content"])]),
        types.Content(role="model", parts=[types.Part(text=first.choices[0].message.content)]),
        types.Content(role="user", parts=[types.Part(text=fp.WEATHER[0]["content"])]),
    ]
    config = types.GenerateContentConfig(temperature=0.0, max_output_tokens=32)
    client = by_path(s)  # held: the SDK closes a client it collects, mid-request
    client.models.generate_content(model="tiny", contents=contents, config=config)
    summary = finish(qwen3, s["session_id"])
    assert [c["cause"] for c in summary["segment_causes"]] == ["start", "mode_switch"]
