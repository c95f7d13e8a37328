"""Claude Code's request shape on the Messages surface, from a captured request of the real CLI.

`tests/fixtures/claude_code/first_request.json` is the first `/v1/messages` body Claude Code
2.1.332 sent to `rlgw serve` with its default settings (`claude -p "Say hi"`; the device id and
paths scrubbed): a `{"role": "system"}` turn inside `messages`, `thinking: {"type":
"adaptive"}`, `output_config`, `context_management` and `max_tokens: 128000`. It is translated,
rendered through the served template (which places a mid-conversation system turn) or folded
into a `<system-reminder>` for a template that cannot, and its errors are worded as Anthropic's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from rlgw.gateway.errors import Conflict, ContextLengthExceeded, InvalidRequest, UpstreamOverloaded
from rlgw.gateway.model.render import ChatRenderer, TemplateConfig
from rlgw.gateway.surfaces.anthropic import translate as at
from rlgw.gateway.surfaces.anthropic.api import turn_params
from rlgw.gateway.surfaces.anthropic.errors import anthropic_error_body, error_headers, status_of
from rlgw.gateway.surfaces.anthropic.mid_system import fold_mid_system, places_mid_system, reminder
from rlgw.gateway.tenancy.limits import RateLimited

CAPTURED = Path(__file__).parents[2] / "fixtures" / "claude_code" / "first_request.json"


def captured() -> dict[str, Any]:
    return json.loads(CAPTURED.read_text())


@pytest.fixture(scope="module")
def qwen3(tiny_qwen3: Path) -> ChatRenderer:
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_qwen3))


@pytest.fixture(scope="module")
def no_mid_system(tiny_qwen3: Path) -> ChatRenderer:
    """Qwen3's template without its branch for a system turn after the first message (it drops one)."""
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    template = tok.chat_template.replace(
        '(message.role == "user") or (message.role == "system" and not loop.first)', 'message.role == "user"'
    )
    assert template != tok.chat_template
    return ChatRenderer(tok, TemplateConfig(chat_template=template))


def test_the_captured_request_translates_with_its_system_turn_in_place(qwen3: ChatRenderer) -> None:
    body = captured()
    assert [m["role"] for m in body["messages"]] == ["user", "system"]
    assert body["thinking"]["type"] == "adaptive" and body["output_config"] and body["context_management"]
    params = turn_params(at.MessagesRequest.model_validate(body), renderer=qwen3)
    assert [m["role"] for m in params.messages] == ["system", "user", "system"]
    assert params.template_kwargs == {"enable_thinking": True}
    assert params.max_tokens == 128000 and len(params.tools or []) == len(body["tools"])
    mid = "\n".join(b["text"] for b in body["messages"][1]["content"])
    text = qwen3.render_text(params.messages, params.tools, add_generation_prompt=True)
    assert places_mid_system(qwen3)
    assert f"<|im_start|>system\n{mid}<|im_end|>\n<|im_start|>assistant\n" in text


def test_a_template_that_cannot_place_it_gets_anthropics_fallback(no_mid_system: ChatRenderer) -> None:
    body = captured()
    assert not places_mid_system(no_mid_system)
    params = turn_params(at.MessagesRequest.model_validate(body), renderer=no_mid_system)
    assert [m["role"] for m in params.messages] == ["system", "user"]
    user = "\n".join(b["text"] for b in body["messages"][0]["content"])
    mid = "\n".join(b["text"] for b in body["messages"][1]["content"])
    assert params.messages[1]["content"] == user + "\n" + reminder(mid)
    text = no_mid_system.render_text(params.messages, params.tools, add_generation_prompt=True)
    assert "<system-reminder>\n# Environment" in text


def test_fold_moves_each_system_turn_into_the_adjacent_user_turn() -> None:
    msgs = [
        {"role": "system", "content": "prompt"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "system", "content": "s1"},
        {"role": "system", "content": "s2"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"},
        {"role": "tool", "tool_call_id": "c", "content": "r"},
        {"role": "system", "content": "s3"},
    ]
    assert fold_mid_system(msgs) == [
        {"role": "system", "content": "prompt"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": f"{reminder('s1')}\n{reminder('s2')}\nq2"},
        {"role": "assistant", "content": "a2"},
        {"role": "tool", "tool_call_id": "c", "content": "r"},
        {"role": "user", "content": reminder("s3")},
    ]
    plain = [{"role": "system", "content": "p"}, {"role": "user", "content": "q"}]
    assert fold_mid_system(plain) is plain


def test_a_system_turn_with_no_text_adds_nothing() -> None:
    # Claude Code sends `{"role": "system", "content": [], "output_config": {...}}` statements.
    req = at.MessagesRequest.model_validate(
        {
            "max_tokens": 8,
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "system", "content": [], "output_config": {"effort": "low"}},
            ],
        }
    )
    assert at.turn_params(req).messages == [{"role": "user", "content": "hi"}]


def test_a_tool_addition_in_a_system_turn_names_claude_codes_fallback_code() -> None:
    req = at.MessagesRequest.model_validate(
        {"max_tokens": 8, "messages": [{"role": "system", "content": [{"type": "tool_addition"}]}]}
    )
    with pytest.raises(InvalidRequest) as e:
        at.turn_params(req)
    body = anthropic_error_body(e.value)
    assert body["error"]["details"] == {"error_code": "mid_conversation_tool_changes_not_supported"}


def test_errors_are_worded_as_anthropics_clients_parse_them() -> None:
    over = ContextLengthExceeded("x", param="max_tokens", prompt_tokens=17900, max_tokens=128000, limit=65536)
    body = anthropic_error_body(over)
    assert body["error"]["type"] == "invalid_request_error"
    # Claude Code's own pattern, which it parses to retry with a smaller max_tokens.
    assert body["error"]["message"].startswith(
        "input length and `max_tokens` exceed context limit: 17900 + 128000 > 65536"
    )
    long = ContextLengthExceeded("x", param="messages", prompt_tokens=9000, limit=8192)
    assert anthropic_error_body(long)["error"]["message"] == "prompt is too long: 9000 tokens > 8192 maximum"
    busy = UpstreamOverloaded("engine answered 503")
    assert status_of(busy) == 529 and anthropic_error_body(busy)["error"]["type"] == "overloaded_error"
    limited = RateLimited("over", code="in_flight", retry_after=2.5)
    assert status_of(limited) == 429 and anthropic_error_body(limited)["error"]["type"] == "rate_limit_error"
    assert error_headers(limited) == {"Retry-After": "3"}
    # The SDKs retry a 409; a finished session never serves again.
    assert error_headers(Conflict("finished")) == {"x-should-retry": "false"}
