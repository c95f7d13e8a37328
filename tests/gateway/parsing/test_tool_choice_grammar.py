"""`tool_choice` that promises a call is kept by a grammar over the template's tool-call format.

The grammar itself, compiled by xgrammar against the tiny-qwen3 tokenizer, admits exactly the calls
of the allowed tools in the template's text (think block first when the model reasons). End to end
(the real `openai` and `anthropic` clients -> `rlgw serve` -> recording proxy -> `rlgw engine` on
tiny-qwen3): after a tool result the fixture answers in text; with `tool_choice` naming
`list_files` (Chat), `required` (Chat, streamed, thinking on), Anthropic's `{"type": "tool"}` and
Responses' named function, the same prompt gets a call of that tool whose arguments fit its schema,
the stored sample's mask-1 tokens are the engine's sampled ids and logprobs, its prompt is the
template's render, and its metadata names the constrained turn (whose logprobs a forward pass
without the grammar does not reproduce).
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest
from transformers import AutoTokenizer

from rlgw.gateway.errors import InvalidRequest
from rlgw.gateway.parsing.tool_choice_grammar import CONSTRAINED_NOTE, forced_tools, tool_choice_grammar
from tests.support import fixture_prompts as fp
from tests.support.e2e import Stack, check_engine_spans, finish, open_session, sglang_forced_logprobs, stored
from tests.support.procs import FIXTURES


def bounded(tool: dict[str, Any], key: str) -> dict[str, Any]:
    """`tool` with its string parameter `key` at most 16 characters: the grammar holds the tiny model,
    which would otherwise keep writing its text answer inside the string, to a short value."""
    fn = tool["function"]
    props = {**fn["parameters"]["properties"], key: {**fn["parameters"]["properties"][key], "maxLength": 16}}
    return {**tool, "function": {**fn, "parameters": {**fn["parameters"], "properties": props}}}


TOOLS = [bounded(fp.GET_WEATHER, "city"), bounded(fp.LIST_FILES, "path")]
LIST_SCHEMA = TOOLS[1]["function"]["parameters"]
NAMED = {"type": "function", "function": {"name": "list_files"}}
CALL = fp.tool_call_text("list_files", {"path": "/tmp"})
WEATHER = fp.tool_call_text("get_weather", {"city": "Paris"})


def grammar(choice: Any, *, fmt: str = "qwen25", parallel: bool = True, reasoning: bool = False,
            forced: bool = False) -> str:  # fmt: skip
    g = tool_choice_grammar(fp.TOOLS, choice, tool_format=fmt, parallel=parallel, reasoning=reasoning,
                            reasoning_forced=forced)  # fmt: skip
    assert g is not None
    return g.source


@pytest.fixture(scope="module")
def accepts():
    """`accepts(source, text)`: whether the structural tag admits `text` then EOS, token by token."""
    xgr = pytest.importorskip("xgrammar")
    tok = AutoTokenizer.from_pretrained(str(FIXTURES / "tiny-qwen3"))
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    compiler = xgr.GrammarCompiler(
        xgr.TokenizerInfo.from_huggingface(tok, vocab_size=4096, stop_token_ids=[eos])
    )

    def accepts(source: str, text: str) -> bool:
        matcher = xgr.GrammarMatcher(compiler.compile_structural_tag(source))
        ids = [*tok.encode(text, add_special_tokens=False), eos]
        return all(matcher.accept_token(t) for t in ids) and matcher.is_terminated()

    return accepts


def test_only_required_or_named_choices_are_constrained() -> None:
    for choice in (None, "auto", "none"):
        assert tool_choice_grammar(fp.TOOLS, choice, tool_format="qwen25", parallel=True, reasoning=False,
                                   reasoning_forced=False) is None  # fmt: skip
    assert tool_choice_grammar(None, "required", tool_format="qwen25", parallel=True, reasoning=False,
                               reasoning_forced=False) is None  # fmt: skip
    assert forced_tools(fp.TOOLS, NAMED) == [fp.LIST_FILES]
    with pytest.raises(InvalidRequest, match="has none"):
        tool_choice_grammar(fp.TOOLS, "required", tool_format=None, parallel=True, reasoning=False,
                            reasoning_forced=False)  # fmt: skip


def test_required_admits_calls_of_any_tool_in_the_template_text_and_nothing_else(accepts) -> None:
    src = grammar("required")
    assert accepts(src, CALL) and accepts(src, WEATHER) and accepts(src, CALL + "\n" + WEATHER)
    assert not accepts(src, "It is sunny.")
    assert not accepts(src, fp.tool_call_text("list_files", {"path": 3}))  # the schema holds
    assert not accepts(src, fp.tool_call_text("list_files", {}))  # `path` is required
    assert not accepts(src, fp.tool_call_text("rm", {"path": "/"}))
    assert not accepts(grammar("required", parallel=False), CALL + "\n" + WEATHER)


def test_named_admits_that_tool_only(accepts) -> None:
    src = grammar(NAMED, parallel=False)
    assert accepts(src, CALL) and not accepts(src, WEATHER)


def test_a_reasoning_model_may_think_first_and_must_close_a_forced_think_block(accepts) -> None:
    thinking = grammar("required", reasoning=True)
    assert accepts(thinking, "<think>\nI will list.\n</think>\n\n" + CALL) and accepts(thinking, CALL)
    assert not accepts(thinking, "<think>\nhm\n</think>\n\nNo.")
    forced = grammar("required", reasoning=True, forced=True)
    assert accepts(forced, "I will list.\n</think>\n\n" + CALL) and not accepts(forced, CALL)


def test_qwen3_coder_calls_are_xml_parameters(accepts) -> None:
    src = grammar(NAMED, fmt="qwen3_coder")
    xml = (
        "<tool_call>\n<function=list_files>\n<parameter=path>\n/tmp\n</parameter>\n</function>\n</tool_call>"
    )
    assert accepts(src, xml)
    assert not accepts(src, CALL)


# ---------------------------------------------------------------- end to end on tiny-qwen3

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


def check_constrained(st: Stack, sid: str) -> dict[str, Any]:
    """Finish the one-turn session; its sample is token-exact and names its turn as constrained."""
    summary = finish(st, sid)
    assert summary["rejects"] == [] and len(summary["samples"]) == 1
    doc = stored(st, summary["samples"][0]["cursor"])
    runs = check_engine_spans(
        st, doc
    )  # mask 1 = the engine's sampled ids and logprobs, fed the series before
    assert doc["metadata"][CONSTRAINED_NOTE] == doc["metadata"]["response_ids"]
    assert "tool_parse_errors" not in doc["metadata"]
    # The prompt is the template's render of the request (tools included).
    p = len(doc["tokens"]) - doc["response_length"]
    assert st.tokenizer.decode(doc["tokens"][:p]).startswith("<|im_start|>system\n")
    # A forward pass without the grammar gives other logprobs for the constrained tokens.
    forced = sglang_forced_logprobs(st.engine, list(doc["tokens"]))
    a, b = runs[-1]
    recorded = doc["rollout_log_probs"][a - p : b - p]
    assert any(abs(r - f) > 1e-3 for r, f in zip(recorded, forced[a:b], strict=True))
    return doc


def client(st: Stack, s: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)


def test_chat_named_function_makes_a_model_that_answers_in_text_call_it(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="tool-choice-named")
    c = client(qwen3, s)
    free = c.chat.completions.create(model="m", messages=fp.AFTER_TOOL, tools=TOOLS, temperature=0.0,
                                     max_tokens=120, extra_body=NO_THINK)  # fmt: skip
    assert (
        free.choices[0].message.tool_calls is None and free.choices[0].message.content
    )  # the fixture's answer
    assert (
        CONSTRAINED_NOTE
        not in stored(qwen3, finish(qwen3, s["session_id"])["samples"][0]["cursor"])["metadata"]
    )
    s = open_session(qwen3, task_id="tool-choice-named")
    c = client(qwen3, s)
    r = c.chat.completions.create(model="m", messages=fp.AFTER_TOOL, tools=TOOLS, tool_choice=NAMED,
                                  temperature=0.0, max_tokens=120, extra_body=NO_THINK)  # fmt: skip
    (call,) = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "list_files"
    jsonschema.validate(json.loads(call.function.arguments), LIST_SCHEMA)
    assert check_constrained(qwen3, s["session_id"])["metadata"]["response_ids"] == [r.id]


def test_chat_required_streamed_with_thinking(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="tool-choice-required")
    c = client(qwen3, s)
    stream = c.chat.completions.create(
        model="m", messages=fp.AFTER_TOOL, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
        temperature=0.0, max_tokens=200, stream=True,
    )  # fmt: skip
    names, args = [], {}
    for chunk in stream:
        for tc in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            if tc.function.name:
                names.append(tc.function.name)
            args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
    assert len(names) == 1 and names[0] in ("get_weather", "list_files")
    schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == names[0])
    jsonschema.validate(json.loads(args[0]), schema)
    check_constrained(qwen3, s["session_id"])


def test_anthropic_tool_choice_tool(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="tool-choice-anthropic")
    root = s["base_url"].removesuffix("/v1")
    c = anthropic.Anthropic(base_url=root, api_key=s["api_key"], max_retries=0)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]  # fmt: skip
    messages = [
        {"role": "user", "content": fp.WEATHER[0]["content"]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_0", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_0",
                                      "content": fp.AFTER_TOOL[-1]["content"]}]},
    ]  # fmt: skip
    r = c.messages.create(model="m", max_tokens=200, messages=messages, tools=tools,
                          tool_choice={"type": "tool", "name": "list_files"},
                          extra_body={"temperature": 0.0})  # fmt: skip
    uses = [b for b in r.content if b.type == "tool_use"]
    assert r.stop_reason == "tool_use" and [u.name for u in uses] == ["list_files"]
    jsonschema.validate(uses[0].input, LIST_SCHEMA)
    check_constrained(qwen3, s["session_id"])


def test_responses_named_function(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="tool-choice-responses")
    c = client(qwen3, s)
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    items = [
        {"role": "user", "content": fp.WEATHER[0]["content"]},
        {
            "type": "function_call",
            "call_id": "call_0",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_0", "output": fp.AFTER_TOOL[-1]["content"]},
    ]
    r = c.responses.create(model="m", input=items, tools=tools, temperature=0.0, max_output_tokens=200,
                           tool_choice={"type": "function", "name": "list_files"})  # fmt: skip
    calls = [o for o in r.output if o.type == "function_call"]
    assert [o.name for o in calls] == ["list_files"]
    jsonschema.validate(json.loads(calls[0].arguments), LIST_SCHEMA)
    check_constrained(qwen3, s["session_id"])


def test_a_second_grammar_is_a_400(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="tool-choice-conflict")
    body = {"model": "m", "messages": fp.AFTER_TOOL, "tools": TOOLS, "tool_choice": "required",
            "response_format": {"type": "json_object"}}  # fmt: skip
    r = httpx.post(s["base_url"] + "/chat/completions", headers={"authorization": f"Bearer {s['api_key']}"},
                   json=body)  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text
