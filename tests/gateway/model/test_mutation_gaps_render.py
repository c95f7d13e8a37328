"""Rendering gaps the mutation bench found (`bench/mutation.py`), on real tokenizers: what
`--chat-template` accepts as Jinja text, and a template whose turn ends with a token that was
added to the vocabulary without being marked special."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from rlgw.gateway.errors import InvalidRequest
from rlgw.gateway.model.render import ChatRenderer, TemplateConfig, TemplateIncompatible, read_chat_template

# A ChatML-like template that closes turns with a plain added token instead of <|im_end|>.
TURN_END = "<turn_end>"
PLAIN_END = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}" + TURN_END + "\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize(
    "template",
    [
        "{{ messages[0].content }}",  # expressions only
        "{% for m in messages %}x{% endfor %}",  # statements only
    ],
)
def test_either_jinja_delimiter_marks_template_text(template: str) -> None:
    assert read_chat_template(template) == template


@pytest.mark.parametrize("value", ["chatml", "{ not jinja }", "}} %}"])
def test_text_with_no_opening_jinja_delimiter_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="neither a readable file nor Jinja"):
        read_chat_template(value)


def test_a_turn_end_added_to_the_vocabulary_is_the_stop_token(tiny_qwen3: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)  # a fresh copy: it gains a token below
    assert tok.add_tokens([TURN_END]) == 1
    end_id = tok.convert_tokens_to_ids(TURN_END)
    assert end_id not in tok.all_special_ids and end_id in tok.added_tokens_decoder
    r = ChatRenderer(tok, TemplateConfig(chat_template=PLAIN_END))
    assert r.end_of_turn_text == TURN_END and r.stop_token_ids[0] == end_id
    inc = r.render_continuation(
        [{"role": "user", "content": "more"}], None, previous_ended_with_eos=True, anchor_user=None
    )
    assert tok.decode(inc) == "\n<|im_start|>user\nmore" + TURN_END + "\n<|im_start|>assistant\n"


def test_a_turn_end_that_is_not_one_token_is_refused(tiny_qwen3: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)  # TURN_END not added: it is several plain tokens
    with pytest.raises(TemplateIncompatible, match="does not start with"):
        ChatRenderer(tok, TemplateConfig(chat_template=PLAIN_END))


def _chatml(tiny_qwen3: Path, template: str) -> ChatRenderer:
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_qwen3), TemplateConfig(chat_template=template))


def test_a_template_that_ends_a_turn_only_before_the_next_one_is_refused(tiny_qwen3: Path) -> None:
    # <|im_end|> is written between messages, never after the last one: the engine could not stop
    # on a turn end that the template only writes once more is said.
    between = (
        "{% for m in messages %}{% if not loop.first %}<|im_end|>\n{% endif %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<|im_end|>\n<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(TemplateIncompatible, match="followed by a turn end"):
        _chatml(tiny_qwen3, between)


def test_a_template_that_closes_a_followed_turn_differently_is_refused(tiny_qwen3: Path) -> None:
    # The last assistant turn ends with <|im_end|>, one followed by more messages with a newline only:
    # an increment would not start with the end-of-turn token the engine emitted.
    last_only = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% if loop.last or m.role != 'assistant' %}<|im_end|>{% endif %}\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    r = _chatml(tiny_qwen3, last_only)
    with pytest.raises(TemplateIncompatible, match="after an assistant turn the template emitted"):
        r.render_continuation([{"role": "user", "content": "next"}], None, previous_ended_with_eos=True)


def test_a_refusal_of_the_agents_own_anchor_is_reported_not_replaced(tiny_qwen3: Path) -> None:
    # The plain stand-in anchor is only for templates that need a user turn first; when the template
    # refuses the conversation's real last user message, the increment is not rendered without it.
    picky = (
        "{% for m in messages %}{% if m.content == 'forbidden' %}{{ raise_exception('no') }}{% endif %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    r = _chatml(tiny_qwen3, picky)
    new = [{"role": "user", "content": "next"}]
    anchor = {"role": "user", "content": "forbidden"}
    with pytest.raises(InvalidRequest, match="rejected the messages"):
        r.render_continuation(new, None, previous_ended_with_eos=True, anchor_user=anchor)
    ok = r.render_continuation(
        new, None, previous_ended_with_eos=True, anchor_user={"role": "user", "content": "a"}
    )
    assert r.tokenizer.decode(ok) == "\n<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("part", [5, None, ["text"]])
def test_a_content_part_that_is_not_an_object_is_a_400(tiny_qwen3: Path, part: object) -> None:
    r = _chatml(tiny_qwen3, PLAIN_END.replace(TURN_END, "<|im_end|>"))
    with pytest.raises(InvalidRequest) as err:
        r.normalize([{"role": "user", "content": ["hello", part]}])
    assert err.value.param == "messages[0].content" and type(part).__name__ in err.value.message


def test_tool_calls_that_are_not_objects_are_a_400_and_calls_without_function_pass(tiny_qwen3: Path) -> None:
    r = _chatml(tiny_qwen3, PLAIN_END.replace(TURN_END, "<|im_end|>"))
    with pytest.raises(InvalidRequest) as err:
        r.normalize([{"role": "assistant", "content": None, "tool_calls": ["get_weather()"]}])
    assert err.value.param == "messages"
    bare = {"id": "call_1", "type": "function"}
    odd = {"id": "call_2", "type": "function", "function": "get_weather"}
    [m] = r.normalize([{"role": "assistant", "content": None, "tool_calls": [bare, odd]}])
    assert m == {"role": "assistant", "content": "", "tool_calls": [bare, odd]}


def test_a_template_that_refuses_tools_does_not_render_them_and_keeps_them_in_increments(
    tiny_qwen3: Path,
) -> None:
    no_tools = (
        "{% if tools %}{{ raise_exception('this template takes no tools') }}{% endif %}"
        + PLAIN_END.replace(TURN_END, "<|im_end|>")
    )
    r = _chatml(tiny_qwen3, no_tools)
    assert r.renders_tools is False and r.encoder_name == "tokenizers"
    # Unsure whether tools reach increments, the renderer keeps giving them: the template's refusal
    # is reported, not hidden by dropping the tools.
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(InvalidRequest, match="takes no tools"):
        r.render_continuation([{"role": "user", "content": "x"}], tools, previous_ended_with_eos=True)


def test_text_parts_join_and_null_arguments_become_an_empty_object(tiny_qwen3: Path) -> None:
    r = _chatml(tiny_qwen3, PLAIN_END.replace(TURN_END, "<|im_end|>"))
    parts = ["one", {"type": "text", "text": "two"}, "three"]
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": None}}
    user, assistant = r.normalize(
        [{"role": "user", "content": parts}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    )
    assert user == {"role": "user", "content": "one\ntwo\nthree"}
    assert assistant["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {}}}
    ]
