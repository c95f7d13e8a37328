"""The Responses surface driven by the real `openai` SDK and the OpenAI Agents SDK.

`rlgw serve` in front of the recording proxy and the embedded engine on tiny-qwen3 (the
harness of `tests/support/e2e.py`): each tool loop is recorded as one sample and checked token for token
(mask-1 = the engine's ids, mask-0 = the template's full-render increments, logprobs = the
engine's teacher-forced logprobs). `previous_response_id` continues the same ledger.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from rlgw.gateway.surfaces.responses.translate import chat_messages
from tests.support import fixture_prompts as fp
from tests.support.e2e import Run, Stack, check_sample, echo, finish, open_session, stored
from tests.support.surface_e2e import chat_reply, result_text

pytestmark = pytest.mark.slow

TOOLS = [{"type": "function", **t["function"]} for t in fp.TOOLS]
BERLIN = "What is the weather in Berlin?"


def as_chat(response: Any) -> Any:
    """A Response's output as `check_sample` reads replies."""
    text = "".join(c.text for i in response.output if i.type == "message" for c in i.content)
    reasoning = "".join(c.text for i in response.output if i.type == "reasoning" for c in i.content or [])
    calls = [(i.call_id, i.name, i.arguments) for i in response.output if i.type == "function_call"]
    return chat_reply(text, reasoning, calls)


def tool_loop(
    client: openai.OpenAI, *, stream: bool, chained: bool, kw: dict[str, Any]
) -> tuple[Run, list[Any]]:
    """Call tools, answer with their outputs, ask one follow-up; chained: send only new items."""
    items: list[Any] = [{"role": "user", "content": fp.WEATHER[0]["content"]}]
    chat: list[dict[str, Any]] = list(fp.WEATHER)
    followups = [BERLIN]
    run, responses = Run(), []
    previous: str | None = None
    for _ in range(8):
        run.requests.append(list(chat))
        kwargs: dict[str, Any] = {"model": "m", "input": items, "tools": TOOLS, "temperature": 0.0}
        kwargs |= {"max_output_tokens": 256, "extra_body": {"chat_template_kwargs": kw}}
        if previous:
            kwargs["previous_response_id"] = previous
        if stream:
            with client.responses.stream(**kwargs) as s:
                kinds = [e.type for e in s]
                response = s.get_final_response()
            assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        else:
            response = client.responses.create(**kwargs)
        responses.append(response)
        run.replies.append(as_chat(response))
        chat.append(echo(run.replies[-1], reserialize=False, drop_reasoning=False))
        calls = [i for i in response.output if i.type == "function_call"]
        new: list[Any] = []
        if calls:
            outputs = [(c.call_id, result_text(c.name, json.loads(c.arguments))) for c in calls]
            new = [{"type": "function_call_output", "call_id": i, "output": o} for i, o in outputs]
            chat += [{"role": "tool", "tool_call_id": i, "content": o} for i, o in outputs]
        elif followups:
            new = [{"role": "user", "content": followups[0]}]
            chat.append({"role": "user", "content": followups.pop(0)})
        else:
            break
        if chained:
            items, previous = new, response.id
        else:
            items = [*items, *response.output, *new]
    return run, responses


def recorded(st: Stack, sid: str, run: Run, kw: dict[str, Any]) -> dict[str, Any]:
    summary = finish(st, sid)
    assert summary["segments"] == 1 and summary["rejects"] == []
    doc = stored(st, summary["samples"][0]["cursor"])
    check_sample(st, doc, run, fp.TOOLS, kw)
    return doc


def test_responses_create_tool_loop_is_one_token_exact_sample(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="responses-create")
    client = openai.OpenAI(base_url=qwen3.gateway + "/v1", api_key=s["api_key"], max_retries=0)
    kw = {"enable_thinking": False}
    run, responses = tool_loop(client, stream=False, chained=False, kw=kw)
    # The fixture calls get_weather, answers from its output, and answers the follow-up.
    assert len(responses) >= 3 and all(r.status == "completed" for r in responses)
    calls = [i for r in responses for i in r.output if i.type == "function_call"]
    assert calls and all(c.call_id.startswith("call_") for c in calls)  # the ids the gateway minted
    assert responses[0].output[-1].type == "function_call" and responses[-1].output_text
    assert responses[0].usage.input_tokens > 0
    recorded(qwen3, s["session_id"], run, kw)


def test_responses_stream_chained_by_previous_response_id_is_one_token_exact_sample(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="responses-stream")
    client = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
    run, responses = tool_loop(client, stream=True, chained=True, kw={})
    assert len(responses) >= 3 and responses[0].output[-1].type == "function_call"
    assert any(i.type == "reasoning" for r in responses for i in r.output), (
        "thinking is on: the fixture reasons"
    )
    assert responses[1].previous_response_id == responses[0].id
    recorded(qwen3, s["session_id"], run, {})


def test_unknown_or_unstored_previous_response_id_is_a_400(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="responses-missing")
    client = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model="m", input="hi", previous_response_id="resp_nope")
    assert bad.value.code == "previous_response_not_found" and bad.value.param == "previous_response_id"
    # store=false: the gateway keeps nothing to continue from.
    kept = client.responses.create(model="m", input=fp.PLAIN[0]["content"], max_output_tokens=8, store=False)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="m", input="and?", previous_response_id=kept.id)
    r = httpx.post(s["base_url"] + "/responses", json={"input": [{"type": "item_reference", "id": "x"}]})
    assert r.status_code == 400 and "item_reference" in r.json()["error"]["message"]
    finish(qwen3, s["session_id"])


def test_agents_sdk_default_model_runs_a_recorded_tool_loop(qwen3: Stack) -> None:
    agents = pytest.importorskip("agents")
    s = open_session(qwen3, task_id="agents")
    bodies: list[dict[str, Any]] = []

    async def keep(request: httpx.Request) -> None:
        if request.url.path.endswith("/responses"):
            bodies.append(json.loads(request.content))

    async def tool(ctx: Any, arguments: str) -> str:
        return result_text("get_weather", json.loads(arguments))

    weather = agents.FunctionTool(
        name="get_weather",
        description=fp.GET_WEATHER["function"]["description"],
        params_json_schema=fp.GET_WEATHER["function"]["parameters"],
        on_invoke_tool=tool,
        strict_json_schema=False,
    )
    lister = agents.FunctionTool(
        name="list_files",
        description=fp.LIST_FILES["function"]["description"],
        params_json_schema=fp.LIST_FILES["function"]["parameters"],
        on_invoke_tool=tool,
        strict_json_schema=False,
    )

    async def main() -> Any:
        http = httpx.AsyncClient(event_hooks={"request": [keep]})
        client = openai.AsyncOpenAI(
            base_url=s["base_url"], api_key=s["api_key"], http_client=http, max_retries=0
        )
        # The Agents SDK's default model is the Responses one: no model_provider override.
        agents.set_default_openai_client(client, use_for_tracing=False)
        agents.set_tracing_disabled(True)
        settings = agents.ModelSettings(
            temperature=0.0, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
        )
        agent = agents.Agent(name="weather", tools=[weather, lister], model="m", model_settings=settings)
        first = await agents.Runner.run(agent, fp.WEATHER[0]["content"])
        follow = [*first.to_input_list(), {"role": "user", "content": BERLIN}]
        streamed = agents.Runner.run_streamed(agent, follow)
        async for _ in streamed.stream_events():
            pass
        await http.aclose()
        return first, streamed

    first, second = asyncio.run(main())
    assert first.final_output and second.final_output
    modes = [b.get("stream", False) for b in bodies]
    assert len(bodies) >= 3 and modes[:2] == [False, False] and modes[-1] is True
    assert any(i.get("type") == "function_call" for i in bodies[1]["input"]), "the first run called a tool"
    # The conversation the Agents SDK sent each turn, as chat messages (the module under test's
    # translation; its unit tests pin it), and what came back, from the next request's echo.
    run = Run(requests=[chat_messages(b.get("instructions"), b["input"]) for b in bodies])
    for k in range(len(bodies)):
        if k + 1 < len(bodies):
            turn = run.requests[k + 1][len(run.requests[k])]
        else:
            turn = {"role": "assistant", "content": second.final_output}
        calls = [
            (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in turn.get("tool_calls") or []
        ]
        run.replies.append(chat_reply(turn["content"], turn.get("reasoning_content"), calls))
    recorded(qwen3, s["session_id"], run, {"enable_thinking": False})


CODEX = Path(__file__).parents[2] / "fixtures" / "codex" / "first_request.json"


def test_hosted_tools_are_left_out_and_call_arguments_stream_as_sampled(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="codex-tools")
    client = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
    tools = [*TOOLS, {"type": "web_search", "external_web_access": False}]
    kwargs: dict[str, Any] = {"model": "m", "input": fp.WEATHER[0]["content"], "tools": tools}
    with client.responses.stream(**kwargs, temperature=0.0) as stream:
        events = list(stream)
        response = stream.get_final_response()
    (call,) = [i for i in response.output if i.type == "function_call"]
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    # The arguments went out as they were sampled, in more than one piece, and add up to the call.
    assert len(deltas) > 1 and "".join(e.delta for e in deltas) == call.arguments
    assert json.loads(call.arguments) == {"city": "Paris"}
    summary = finish(qwen3, s["session_id"])
    doc = stored(qwen3, summary["samples"][0]["cursor"])
    assert doc["metadata"]["dropped_tools"] == ["web_search"]
    # The model was never shown the hosted tool.
    prompt = qwen3.tokenizer.decode(doc["tokens"][: len(doc["tokens"]) - doc["response_length"]])
    assert "web_search" not in prompt and '"name": "get_weather"' in prompt


def test_codexs_first_request_with_its_defaults_is_served(qwen3: Stack) -> None:
    # Codex's captured request (tests/fixtures/codex), its long instructions cut to fit tiny-qwen3's
    # context: a namespace tool, web_search, no max_output_tokens, store false, streamed.
    body = json.loads(CODEX.read_text())
    for item in body["input"]:
        for part in item["content"]:
            part["text"] = part["text"][:1500]
    # Codex names no output cap: the session's `max_tokens` caps the turn (short, for the test).
    s = open_session(qwen3, task_id="codex", sampling={"max_tokens": 32})
    auth = {"Authorization": f"Bearer {s['api_key']}"}
    r = httpx.post(s["base_url"] + "/responses", json=body, headers=auth, timeout=600)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    kinds = [line.removeprefix("event: ") for line in r.text.splitlines() if line.startswith("event: ")]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    summary = finish(qwen3, s["session_id"])
    doc = stored(qwen3, summary["samples"][0]["cursor"])
    assert doc["metadata"]["dropped_tools"] == ["web_search"] and doc["response_length"] <= 32
    prompt = qwen3.tokenizer.decode(doc["tokens"][: len(doc["tokens"]) - doc["response_length"]])
    assert '"name": "multi_agent_v1.spawn_agent"' in prompt  # the namespace's functions, qualified
