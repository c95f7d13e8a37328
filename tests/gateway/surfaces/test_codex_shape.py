"""Codex's request shape on the Responses surface, from a captured request of the real CLI.

`tests/fixtures/codex/first_request.json` is the first `/v1/responses` body `@openai/codex`
0.171.0 sent with its default settings: function tools, a `namespace` tool grouping its
sub-agent functions, the hosted `web_search` tool, and no `max_output_tokens`. Namespace
functions join the template's tool list under a qualified name and go back to Codex as
`function_call`s naming their namespace; hosted tools are left out (and noted); a turn with no
output cap gets the gateway's default.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from rlgw.gateway.errors import InvalidRequest
from rlgw.gateway.ledger.ledger import Ledger, Policy
from rlgw.gateway.model.profile import ModelProfile
from rlgw.gateway.model.render import ChatRenderer
from rlgw.gateway.parsing.output_parser import ToolCall
from rlgw.gateway.sessions.table import Mode, Session
from rlgw.gateway.surfaces.responses import translate as rt
from rlgw.gateway.turns.lifecycle import engine_sampling
from rlgw.gateway.turns.messages import ChatDelta, ChatStart

CAPTURED = Path(__file__).parents[2] / "fixtures" / "codex" / "first_request.json"


def captured() -> rt.ResponsesRequest:
    return rt.ResponsesRequest.model_validate(json.loads(CAPTURED.read_text()))


def test_namespace_functions_are_flattened_and_hosted_tools_left_out() -> None:
    req = captured()
    params = rt.turn_params(req, rt.input_items(req.input))
    names = [t["function"]["name"] for t in params.tools or []]
    assert "exec_command" in names and "multi_agent_v1.spawn_agent" in names
    assert not any("web_search" in n for n in names)
    assert params.notes == {"dropped_tools": ["web_search"]}
    assert params.max_tokens is None  # Codex names no output cap
    spaces = rt.namespaced(req.tools)
    assert spaces["multi_agent_v1.spawn_agent"] == ("multi_agent_v1", "spawn_agent")


def test_a_call_to_a_namespace_function_goes_back_naming_its_namespace_and_echoes_back() -> None:
    spaces = {"multi_agent_v1.spawn_agent": ("multi_agent_v1", "spawn_agent")}
    item = rt.function_call_item("resp_1", 0, "call_1", "multi_agent_v1.spawn_agent", "{}", spaces)
    assert (item["namespace"], item["name"]) == ("multi_agent_v1", "spawn_agent")
    plain = rt.function_call_item("resp_1", 1, "call_2", "exec_command", "{}", spaces)
    assert "namespace" not in plain and plain["name"] == "exec_command"
    # Codex echoes the item back: the chat history names the qualified function the model called.
    (msg, _) = rt.chat_messages(
        None, [item, {"type": "function_call_output", "call_id": "call_1", "output": "ok"}]
    )
    assert msg["tool_calls"][0]["function"]["name"] == "multi_agent_v1.spawn_agent"


def test_a_streamed_call_to_a_namespace_function_names_its_namespace() -> None:
    req = captured()
    stream = rt.ResponseStream(req, "tiny")
    events = stream.feed(ChatStart("chatcmpl-1", 1))
    call = ToolCall(0, "multi_agent_v1.wait_agent", "")
    events += stream.feed(ChatDelta("tool_call_start", call=call, call_id="call_1"))
    (added,) = [e for e in events if e["type"] == "response.output_item.added"]
    assert added["item"]["namespace"] == "multi_agent_v1" and added["item"]["name"] == "wait_agent"


@pytest.mark.parametrize(
    ("tool", "words"),
    [
        ({"type": "custom", "name": "apply_patch"}, "'custom' tools are not supported"),
        (
            {"type": "namespace", "name": "ns", "tools": [{"type": "custom", "name": "x"}]},
            "function tools only",
        ),
    ],
)
def test_tools_the_template_cannot_express_are_400s(tool: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidRequest, match=words):
        rt.chat_tools([tool])


def test_a_turn_without_an_output_cap_gets_the_default_within_the_context(tiny_qwen3: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    profile = ModelProfile("q", tok, ChatRenderer(tok), 4096, "qwen25", True, default_max_tokens=100)
    sess = Session("s", "t", "task", Mode.CAPTURE, "r", 0, Policy.SEGMENT, {}, {}, ledger=Ledger())
    assert engine_sampling(profile, sess, {}, None, 0, 1000)[0]["max_new_tokens"] == 100
    assert engine_sampling(profile, sess, {}, None, 0, 4050)[0]["max_new_tokens"] == 46  # the room left
    assert engine_sampling(profile, sess, {}, 500, 0, 1000)[0]["max_new_tokens"] == 500  # the request's
    profile.default_max_tokens = None  # `--default-max-tokens 0`: the rest of the context
    assert engine_sampling(profile, sess, {}, None, 0, 1000)[0]["max_new_tokens"] == 3096
