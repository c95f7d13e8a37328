"""Rendering at its edges, on the real Qwen3 tokenizer: kwargs the renderer owns, templates that repeat
tools in later turns (or never write them), templates that insist on a user turn first, and the
end-of-turn bookkeeping (stop ids, a closing kept when the turn was cut)."""

from __future__ import annotations

import jinja2
import pytest

from rlgw.gateway.errors import InvalidRequest
from rlgw.gateway.model.render import (
    ChatRenderer,
    TemplateConfig,
    TemplateIncompatible,
    check_template_kwargs,
)
from tests.support.real_tokenizers import qwen3_tokenizer

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
USER = {"role": "user", "content": "And in Rome?"}
TURNS = (
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Like Mistral's: the tool list is written before every user turn, so it reaches increments too.
TOOLS_EACH_TURN = (
    "{% for m in messages %}{% if m.role == 'user' and tools %}[TOOLS]"
    "{% for t in tools %}{{ t.function.name }};{% endfor %}[/TOOLS]{% endif %}" + TURNS
)
NO_TOOLS = "{% for m in messages %}" + TURNS
# Like Llama 3.1's `tools_in_user_message`: the tool list is written into the first user message.
TOOLS_IN_FIRST_USER = (
    "{% set ns = namespace(done=false) %}{% for m in messages %}"
    "{% if m.role == 'user' and tools and not ns.done %}[TOOLS]"
    "{% for t in tools %}{{ t.function.name }};{% endfor %}[/TOOLS]{% set ns.done = true %}{% endif %}"
    + TURNS
)
USER_FIRST = (
    "{% if messages[0].role != 'user' %}{{ raise_exception('the first message must be a user') }}{% endif %}"
    + NO_TOOLS
)


def renderer(template: str | None = None) -> ChatRenderer:
    return ChatRenderer(qwen3_tokenizer(), TemplateConfig(chat_template=template))


def text(r: ChatRenderer, ids: list[int]) -> str:
    return r.tokenizer.decode(ids)


@pytest.mark.parametrize(
    "key", ["tokenize", "tools", "new_messages", "previous_ended_with_eos", "as_array", "messages", 1]
)
def test_template_kwargs_may_not_set_what_the_renderer_sets(key: object) -> None:
    with pytest.raises(InvalidRequest) as info:
        check_template_kwargs({"enable_thinking": False, key: True})
    assert info.value.param == f"chat_template_kwargs.{key}"


def test_ordinary_template_kwargs_pass() -> None:
    check_template_kwargs({"enable_thinking": False, "reasoning_effort": "low"})


def test_tools_reach_increments_only_where_the_template_writes_them_there() -> None:
    each_turn = renderer(TOOLS_EACH_TURN)
    assert each_turn.renders_tools
    inc = text(each_turn, each_turn.render_continuation([USER], TOOLS, previous_ended_with_eos=True))
    assert (
        inc
        == "\n[TOOLS]get_weather;[/TOOLS]<|im_start|>user\nAnd in Rome?<|im_end|>\n<|im_start|>assistant\n"
    )
    qwen3 = renderer()
    assert qwen3.renders_tools
    inc = text(qwen3, qwen3.render_continuation([USER], TOOLS, previous_ended_with_eos=True))
    assert "get_weather" not in inc  # Qwen3 writes tools once, in the system block of the first prompt
    assert "get_weather" in text(qwen3, qwen3.render_prompt([USER], TOOLS))
    assert not renderer(NO_TOOLS).renders_tools


def test_tools_written_into_the_first_user_message_reach_the_increment_that_holds_it(monkeypatch) -> None:
    r = renderer(TOOLS_IN_FIRST_USER)
    history = [{"role": "system", "content": "s"}, {"role": "assistant", "content": "hi"}]
    full = r.render_text([*history, USER], TOOLS, add_generation_prompt=True)
    closed = r.render_text(history, TOOLS, add_generation_prompt=False)
    # No user turn yet: the increment holds the first user message, and with it the tool list.
    inc = text(r, r.render_continuation([USER], TOOLS, previous_ended_with_eos=False, anchor_user=None))
    assert "[TOOLS]get_weather;[/TOOLS]" in inc
    assert closed[: -len(r.end_of_turn_text + "\n")] + inc == full
    # After a user turn the tool list is behind: the increment has none, and the template is not
    # even handed the tools (rendering them would cost time for text that is thrown away).
    handed: list[object] = []
    render = r._render
    monkeypatch.setattr(r, "_render", lambda msgs, tools, *a: handed.append(tools) or render(msgs, tools, *a))
    later = r.render_continuation([USER], TOOLS, previous_ended_with_eos=True, anchor_user=USER)
    assert text(r, later) == "\n<|im_start|>user\nAnd in Rome?<|im_end|>\n<|im_start|>assistant\n"
    assert handed and all(t is None for t in handed)


def test_increments_that_carry_the_tool_list_are_filled_after_the_first(monkeypatch) -> None:
    each_turn = renderer(TOOLS_EACH_TURN)
    first = each_turn.render_continuation([USER], TOOLS, previous_ended_with_eos=True)
    renders: list[int] = []
    render = jinja2.Template.render
    monkeypatch.setattr(jinja2.Template, "render", lambda *a, **k: renders.append(1) or render(*a, **k))
    again = each_turn.render_continuation(
        [{"role": "user", "content": "And in Oslo?"}], TOOLS, previous_ended_with_eos=True
    )
    assert renders == []  # the skeleton, tool list included, was made with the tools
    assert text(each_turn, again) == text(each_turn, first).replace("Rome", "Oslo")


def test_a_template_that_wants_a_user_turn_first_renders_increments_after_the_plain_anchor() -> None:
    r = renderer(USER_FIRST)
    tool = {"role": "tool", "content": "sunny"}
    # No user message in the history: the anchor would start with the assistant turn, which this
    # template refuses, so the renderer falls back to the user/assistant anchor.
    inc = text(r, r.render_continuation([tool], None, previous_ended_with_eos=True, anchor_user=None))
    assert inc == "\n<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>assistant\n"
    same = r.render_continuation([tool], None, previous_ended_with_eos=True, anchor_user=USER)
    assert text(r, same) == inc


def test_a_template_without_role_markup_renders_increments_from_the_start_of_the_anchor() -> None:
    # With no user message in the history the anchor is the assistant turn alone, and this
    # template writes its content first: the sentinel sits at offset 0 of the render.
    r = renderer("{% for m in messages %}{{ m.content }}<|im_end|>\n{% endfor %}")
    inc = r.render_continuation([{"role": "tool", "content": "sunny"}], None, previous_ended_with_eos=True)
    assert text(r, inc) == "\nsunny<|im_end|>\n"


def test_a_template_that_drops_an_opening_assistant_turn_is_refused_for_that_increment() -> None:
    # The history has no user message, so the anchor is the assistant turn alone; this template
    # skips an assistant turn that opens the conversation, and with it the anchor's sentinel.
    r = renderer(
        "{% for m in messages %}{% if m.role != 'assistant' or not loop.first %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    )
    with pytest.raises(TemplateIncompatible, match="dropped the anchor"):
        r.render_continuation([USER], None, previous_ended_with_eos=True, anchor_user=None)


def test_end_of_turn_bookkeeping() -> None:
    r = renderer(NO_TOOLS)
    eot = r.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert r.end_of_turn_text == "<|im_end|>"
    # Qwen3's EOS is its end-of-turn token: one stop id, not the same id twice.
    assert r.tokenizer.eos_token_id == eot and r.stop_token_ids == [eot]
    cut = r.render_continuation([USER], None, previous_ended_with_eos=False)
    assert cut[0] == eot and text(r, cut).startswith("<|im_end|>\n<|im_start|>user")
    assert r.render_continuation([USER], None, previous_ended_with_eos=True) == cut[1:]


def test_empty_requests() -> None:
    r = renderer(NO_TOOLS)
    with pytest.raises(InvalidRequest, match="must not be empty"):
        r.render_prompt([], None)
    with pytest.raises(ValueError, match="at least one new message"):
        r.render_continuation([], None, previous_ended_with_eos=True)
