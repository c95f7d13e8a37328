"""Gemini requests -> the chat turn's parameters, without a server: the mapping choices
`gateway/surfaces/gemini/translate.py` documents, and the 400s for what it cannot take."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlgw.gateway.errors import ContextLengthExceeded, InvalidRequest
from rlgw.gateway.serving.routing import route_key
from rlgw.gateway.surfaces.gemini import translate as gt
from rlgw.gateway.surfaces.gemini.errors import gemini_error_body

WEATHER = {
    "name": "get_weather",
    "description": "Get the weather.",
    "parameters": {
        "type": "OBJECT",
        "properties": {"city": {"type": "STRING"}, "days": {"type": "ARRAY", "items": {"type": "INTEGER"}}},
        "required": ["city"],
    },
}


def params(body: dict[str, Any], *, stream: bool = False) -> Any:
    return gt.turn_params(gt.GenerateContentRequest.model_validate(body), stream=stream)


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "parts": list(parts)}


def model(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "model", "parts": list(parts)}


def test_a_function_calling_loop_becomes_chat_messages() -> None:
    call = {"functionCall": {"id": "call_1", "name": "get_weather", "args": {"city": "Paris"}}}
    p = params(
        {
            "systemInstruction": {"parts": [{"text": "Be brief."}, {"text": "Use tools."}]},
            "contents": [
                user({"text": "Weather in"}, {"text": "Paris?"}),
                model({"text": "Let me look.", "thought": True}, {"text": "Checking."}, call),
                user(
                    {"functionResponse": {"id": "call_1", "name": "get_weather", "response": {"temp": 20}}},
                    {"text": "And tomorrow?"},
                ),
            ],
            "tools": [{"functionDeclarations": [WEATHER]}],
        }
    )
    assert p.messages == [
        {"role": "system", "content": "Be brief.\nUse tools."},
        {"role": "user", "content": "Weather in\nParis?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Let me look.",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    "id": "call_1",
                }
            ],
        },
        {"role": "tool", "name": "get_weather", "content": '{"temp": 20}', "tool_call_id": "call_1"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    assert p.surface == "gemini" and p.tool_choice is None and not p.stream
    assert p.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Get the weather.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string"},
                        "days": {"type": "array", "items": {"type": "integer"}},
                    },
                    "required": ["city"],
                },
            },
        }
    ]


def test_responses_without_ids_answer_the_earliest_open_call_of_their_name() -> None:
    calls = [{"functionCall": {"name": "get_weather", "args": {"city": c}}} for c in ("A", "B")]
    answers = [
        {"functionResponse": {"name": "get_weather", "response": {"output": "sunny in " + c}}}
        for c in ("A", "B")
    ]
    p = params({"contents": [user({"text": "go"}), model(*calls), user(*answers)]})
    assistant, *tools = p.messages[1:]
    assert all("id" not in c for c in assistant["tool_calls"])  # the ledger matches these by content
    # Gemini CLI's `{"output": text}` is the tool message's text as it is.
    assert [(t["content"], t.get("tool_call_id")) for t in tools] == [
        ("sunny in A", None),
        ("sunny in B", None),
    ]
    with_ids = [{"functionCall": {**c["functionCall"], "id": f"call_{i}"}} for i, c in enumerate(calls)]
    p = params({"contents": [user({"text": "go"}), model(*with_ids), user(*answers)]})
    assert [t["tool_call_id"] for t in p.messages[2:]] == ["call_0", "call_1"]


def test_a_part_with_only_a_thought_signature_adds_nothing() -> None:
    p = params(
        {
            "contents": [
                user({"text": "hi"}),
                model({"thoughtSignature": "c2ln"}, {"text": "yo"}),
                user({"text": "x"}),
            ]
        }
    )
    assert p.messages[1] == {"role": "assistant", "content": "yo"}


def test_snake_case_fields_and_parameters_json_schema_are_taken() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    p = params(
        {
            "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "system_instruction": {"parts": [{"text": "sys"}]},
            "tools": [{"function_declarations": [{"name": "search", "parametersJsonSchema": schema}]}],
            "generation_config": {"max_output_tokens": 7, "top_k": 3},
        }
    )
    assert p.messages[0] == {"role": "system", "content": "sys"}
    assert p.tools == [{"type": "function", "function": {"name": "search", "parameters": schema}}]
    assert p.max_tokens == 7 and p.sampling == {"top_k": 3}


@pytest.mark.parametrize(
    ("config", "choice"),
    [
        ({"mode": "AUTO"}, "auto"),
        ({"mode": "VALIDATED"}, "auto"),
        ({"mode": "ANY"}, "required"),
        ({"mode": "NONE"}, "none"),
        (
            {"mode": "ANY", "allowedFunctionNames": ["get_weather"]},
            {"type": "function", "function": {"name": "get_weather"}},
        ),
    ],
)
def test_function_calling_modes_map_onto_tool_choice(config: dict[str, Any], choice: Any) -> None:
    body = {
        "contents": [user({"text": "hi"})],
        "tools": [{"functionDeclarations": [WEATHER]}],
        "toolConfig": {"functionCallingConfig": config},
    }
    assert params(body).tool_choice == choice


def test_generation_config_maps_onto_sampling_and_template() -> None:
    p = params(
        {
            "contents": [user({"text": "hi"})],
            "generationConfig": {
                "temperature": 0.5,
                "topP": 0.9,
                "topK": 20,
                "seed": 7,
                "stopSequences": ["END"],
                "maxOutputTokens": 64,
                "candidateCount": 1,
                "responseMimeType": "application/json",
                "responseSchema": {"type": "OBJECT", "properties": {"a": {"type": "NUMBER"}}},
                "thinkingConfig": {"thinkingBudget": 0},
            },
        }
    )
    assert p.sampling == {
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 20,
        "sampling_seed": 7,
        "stop": ["END"],
        "json_schema": json.dumps({"type": "object", "properties": {"a": {"type": "number"}}}),
    }
    assert p.max_tokens == 64 and p.template_kwargs == {"enable_thinking": False}
    on = params(
        {"contents": [user({"text": "hi"})], "generationConfig": {"thinkingConfig": {"thinkingBudget": -1}}}
    )
    assert on.template_kwargs == {"enable_thinking": True}
    plain = params(
        {
            "contents": [user({"text": "hi"})],
            "generationConfig": {"thinkingConfig": {"includeThoughts": True}},
        }
    )
    assert plain.template_kwargs == {}  # the template's default stands


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"contents": [user({"text": "hi"})], "generationConfig": {"candidateCount": 2}}, "candidateCount"),
        ({"contents": [user({"inlineData": {"data": "AA=="}})]}, "inlineData"),
        ({"contents": [user({"text": "hi"}), model({"text": "pre"})]}, "last content"),
        ({"contents": [{"role": "system", "parts": [{"text": "hi"}]}]}, "role"),
        (
            {"contents": [model({"functionResponse": {"name": "f", "response": {}}}), user({"text": "x"})]},
            "user turn",
        ),
        ({"contents": [user({"text": "hi"})], "tools": [{"googleSearch": {}}]}, "functionDeclarations"),
        (
            {
                "contents": [user({"text": "hi"})],
                "tools": [{"functionDeclarations": [WEATHER, {**WEATHER, "name": "other"}]}],
                "toolConfig": {
                    "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather", "other"]}
                },
            },
            "allowedFunctionNames",
        ),
        (
            {"contents": [user({"text": "hi"})], "toolConfig": {"functionCallingConfig": {"mode": "ANY"}}},
            "needs tools",
        ),
        (
            {"contents": [user({"text": "hi"})], "generationConfig": {"responseMimeType": "text/x.enum"}},
            "responseMimeType",
        ),
    ],
)
def test_what_the_turn_cannot_take_is_a_400_saying_why(body: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidRequest) as bad:
        params(body)
    assert words in bad.value.message
    assert gemini_error_body(bad.value)["error"]["status"] == "INVALID_ARGUMENT"


def test_a_prompt_over_the_context_is_worded_as_gemini_words_it() -> None:
    exc = ContextLengthExceeded("x", param="messages", prompt_tokens=9000, limit=8192)
    body = gemini_error_body(exc)["error"]
    assert body["code"] == 400 and body["status"] == "INVALID_ARGUMENT"
    assert (
        body["message"] == "The input token count (9000) exceeds the maximum number of tokens allowed (8192)."
    )
    assert body["details"][0]["reason"] == "context_length_exceeded"


@pytest.mark.parametrize(
    ("path", "key"),
    [
        ("/v1/chat/completions", "/v1/chat/completions"),
        ("/v1beta/models/gemini-2.5-pro:generateContent", "/v1beta/models/{model}:generateContent"),
        ("/v1/models/org/name:streamGenerateContent", "/v1/models/{model}:streamGenerateContent"),
        ("/v1beta/tunedModels/x:generateContent", "/v1beta/tunedModels/x:generateContent"),
        ("/a/b/models/m:generateContent", "/a/b/models/m:generateContent"),
    ],
)
def test_route_keys_name_gemini_paths_whatever_the_model(path: str, key: str) -> None:
    assert route_key(path) == key


GEMINI_CLI = Path(__file__).parents[2] / "fixtures" / "gemini_cli" / "second_request.json"


def test_gemini_clis_request_is_one_tool_loop_in_chat_messages() -> None:
    """Gemini CLI 0.61.0's second request as it reached `rlgw serve` (tiny-agent, 2026-12-05): its
    functionCall echoed with the minted id and a thought signature, its functionResponse answering it."""
    p = params(json.loads(GEMINI_CLI.read_text()), stream=True)
    assert [m["role"] for m in p.messages] == ["system", "user", "assistant", "tool"]
    call, result = p.messages[2]["tool_calls"][0], p.messages[3]
    assert call["id"].startswith("call_") and result["tool_call_id"] == call["id"]
    assert call["function"] == {"name": "run_shell_command", "arguments": '{"cmd": "echo hello > hello.txt"}'}
    assert result["content"] == '{"error": "params must have required property \'command\'"}'
    assert p.messages[1]["content"].endswith("</session_context>\nList the files in this directory.")
    assert len(p.tools) == 15 and {t["function"]["parameters"]["type"] for t in p.tools} == {"object"}
    assert p.sampling == {"temperature": 1, "top_p": 0.95, "top_k": 64} and p.template_kwargs == {}
