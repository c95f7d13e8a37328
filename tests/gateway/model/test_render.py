"""Incremental chat-template rendering on real tokenizers: the ledger's ids are what the template feeds.

The key test simulates the ledger over a multi-turn agent conversation: the first prompt, then per
turn the assistant text a model trained on the template would emit (the template's rendering of
that turn as the *last* turn, reasoning and `<|im_end|>` included) and `render_continuation` for the
messages that follow. Its ids are compared with an append-only reference built from the template's
own full renders (the text after the previous assistant turn, per turn), and, where the template
leaves history alone, with the tokenized full render itself.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import jinja2
import numpy as np
import pytest
from transformers import AutoTokenizer

from rlgw.gateway.errors import InvalidRequest
from rlgw.gateway.model.render import (
    SENTINEL,
    ChatRenderer,
    TemplateConfig,
    TemplateIncompatible,
    read_chat_template,
)
from tests.support.real_tokenizers import chatml_tokenizer, qwen3_tokenizer

EOT = "<|im_end|>"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "book_table",
            "description": "Book a restaurant table.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "people": {"type": "integer"}},
            },
        },
    },
]


def call(call_id: str, name: str, arguments: str) -> dict:
    """An OpenAI tool call: arguments as a JSON string."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# Thinking on for the first query (three tool-using turns), off for the second.
CONVERSATION = [
    {"role": "system", "content": "You are a helpful travel agent."},
    {"role": "user", "content": "Is it warmer in Paris or in Berlin right now?"},
    {
        "role": "assistant",
        "reasoning_content": "I need the weather in both cities; call the tool twice.",
        "content": None,
        "tool_calls": [
            call("call_1", "get_weather", '{"city": "Paris"}'),
            call("call_2", "get_weather", '{"city":"Berlin"}'),
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "Paris: 21C, sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "Berlin: 15C, rain\n\n"},
    {
        "role": "assistant",
        "reasoning_content": "Paris is warmer. Let me double-check Paris once more.",
        "content": "Checking again.",
        "tool_calls": [call("call_3", "get_weather", '{"city": "Paris"}')],
    },
    {"role": "tool", "tool_call_id": "call_3", "content": "Paris: 22C, sunny"},
    {
        "role": "assistant",
        "reasoning_content": "Both readings agree.",
        "content": "Paris is warmer (22C vs 15C).",
    },
    {
        "role": "user",
        "content": [{"type": "text", "text": "Great."}, {"type": "text", "text": "Book for 2 there."}],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [call("call_4", "book_table", '{"city": "Paris", "people": 2}')],
    },
    {"role": "tool", "tool_call_id": "call_4", "content": "booked: table 7 at 20:00"},
    {"role": "assistant", "content": "Booked table 7 for two in Paris at 20:00."},
]
ASSISTANTS = [i for i, m in enumerate(CONVERSATION) if m["role"] == "assistant"]
# Template kwargs of the request that generated each assistant turn.
TURN_KWARGS = {2: {"enable_thinking": True}, 5: {"enable_thinking": True}, 7: {"enable_thinking": True}}
TURN_KWARGS |= {9: {"enable_thinking": False}, 11: {"enable_thinking": False}}


@pytest.fixture(scope="module")
def qwen3() -> ChatRenderer:
    return ChatRenderer(qwen3_tokenizer())


@pytest.fixture(scope="module", params=["qwen3", "tiny-qwen3"])
def qwen3_like(request, tiny_qwen3) -> ChatRenderer:
    """The real Qwen3 tokenizer, and the engine tests' tiny fixture (Qwen3 template, 4k BPE)."""
    if request.param == "qwen3":
        return ChatRenderer(qwen3_tokenizer())
    if not (tiny_qwen3 / "tokenizer_config.json").is_file():
        pytest.skip("tests/fixtures/tiny-qwen3 is not built")
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_qwen3))


@pytest.fixture(scope="module")
def chatml() -> ChatRenderer:
    return ChatRenderer(chatml_tokenizer())


@dataclass
class Turn:
    """The ledger just before the engine samples assistant message `index`."""

    index: int
    ids: list[int]
    reference: str  # append-only reference text built from the template's full renders


def emitted_text(r: ChatRenderer, msgs: list[dict], a: int, tools: list[dict] | None, kw: dict) -> str:
    """Assistant turn `a` as the model emits it: the template's last-turn rendering up to `<|im_end|>`."""
    prompt = r.render_text(msgs[:a], tools, add_generation_prompt=True, **kw)
    rendered = r.render_text(msgs[: a + 1], tools, add_generation_prompt=False, **kw)
    assert rendered.startswith(prompt), "the template renders a last turn unlike its generation prompt"
    rest = rendered[len(prompt) :]
    return rest[: rest.index(EOT) + len(EOT)]


def tail_after_assistant(full: str, n: int) -> str:
    """The text of a full render after the end of its n-th assistant turn (n >= 1)."""
    at = -1
    for _ in range(n):
        at = full.index("<|im_start|>assistant", at + 1)
    end = full.index(EOT, at)
    return full[end + len(EOT) :]


def simulate(
    r: ChatRenderer,
    msgs: list[dict],
    tools: list[dict] | None,
    turn_kwargs: dict,
    cut: frozenset = frozenset(),
) -> list[Turn]:
    """Run the ledger over `msgs`; turns in `cut` were cut by length (no `<|im_end|>` sampled)."""
    assistants = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    first = assistants[0]
    ids = r.render_prompt(msgs[:first], tools, **turn_kwargs[first])
    reference = r.render_text(msgs[:first], tools, add_generation_prompt=True, **turn_kwargs[first])
    turns = []
    for k, a in enumerate(assistants):
        kw = turn_kwargs[a]
        if k:
            prev = assistants[k - 1]
            increment = r.render_continuation(
                msgs[prev + 1 : a], tools, previous_ended_with_eos=prev not in cut, **kw
            )
            full = r.render_text(msgs[:a], tools, add_generation_prompt=True, **kw)
            piece = (EOT if prev in cut else "") + tail_after_assistant(full, k)
            assert increment == r.tokenize(piece), f"turn {k}: increment is not the full render's tail"
            as_array = r.render_continuation(
                msgs[prev + 1 : a], tools, previous_ended_with_eos=prev not in cut, as_array=True, **kw
            )
            assert as_array.dtype == np.int32 and as_array.tolist() == increment
            ids += increment
            reference += piece
        turns.append(Turn(a, list(ids), reference))
        sampled = emitted_text(r, msgs, a, tools, kw)
        if a in cut:
            sampled = sampled[: -len(EOT)]
        ids += r.tokenize(sampled)
        reference += sampled
    return turns


def test_qwen3_ledger_matches_append_only_reference_every_turn(qwen3_like: ChatRenderer) -> None:
    turns = simulate(qwen3_like, CONVERSATION, TOOLS, TURN_KWARGS)
    assert [t.index for t in turns] == ASSISTANTS
    for t in turns:
        assert t.ids == qwen3_like.tokenize(t.reference), f"turn at message {t.index}"


def test_qwen3_ledger_equals_full_render_while_history_is_untouched(qwen3_like: ChatRenderer) -> None:
    qwen3 = qwen3_like
    turns = {t.index: t for t in simulate(qwen3, CONVERSATION, TOOLS, TURN_KWARGS)}
    for a in (2, 5, 7):  # one query, thinking on: the template keeps every turn's reasoning
        full = qwen3.render_text(CONVERSATION[:a], TOOLS, add_generation_prompt=True, **TURN_KWARGS[a])
        assert turns[a].ids == qwen3.tokenize(full), f"turn at message {a}"
    # After the second query the template rewrites history: the first query's reasoning is
    # dropped (and, thinking off, the empty think blocks too). The ledger keeps what was sampled.
    reasoning = CONVERSATION[2]["reasoning_content"]
    for a in (9, 11):
        full = qwen3.render_text(CONVERSATION[:a], TOOLS, add_generation_prompt=True, **TURN_KWARGS[a])
        assert reasoning not in full
        assert turns[a].ids != qwen3.tokenize(full)
        assert reasoning in qwen3.tokenizer.decode(turns[a].ids)


def test_qwen3_increment_groups_tools_and_carries_thinking_off_prompt(qwen3: ChatRenderer) -> None:
    tools_turn = qwen3.render_continuation(CONVERSATION[3:5], TOOLS, previous_ended_with_eos=True)
    text = qwen3.tokenizer.decode(tools_turn)
    assert text == (
        "\n<|im_start|>user\n<tool_response>\nParis: 21C, sunny\n</tool_response>\n"
        "<tool_response>\nBerlin: 15C, rain\n\n\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    user_turn = qwen3.render_continuation(
        CONVERSATION[8:9], TOOLS, previous_ended_with_eos=True, enable_thinking=False
    )
    assert qwen3.tokenizer.decode(user_turn).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # The tools preamble belongs to the first prompt only.
    assert "# Tools" not in text and SENTINEL not in text


def test_config_template_kwargs_are_defaults_that_requests_override() -> None:
    r = ChatRenderer(qwen3_tokenizer(), TemplateConfig(template_kwargs={"enable_thinking": False}))
    user = [{"role": "user", "content": "hi"}]
    off = r.tokenizer.decode(r.render_continuation(user, None, previous_ended_with_eos=True))
    on = r.tokenizer.decode(
        r.render_continuation(user, None, previous_ended_with_eos=True, enable_thinking=True)
    )
    assert off.endswith("<think>\n\n</think>\n\n")
    assert on.endswith("<|im_start|>assistant\n")


def test_turn_cut_by_length_gets_the_templates_closing(qwen3_like: ChatRenderer) -> None:
    qwen3 = qwen3_like
    whole = simulate(qwen3, CONVERSATION, TOOLS, TURN_KWARGS)
    cut = simulate(qwen3, CONVERSATION, TOOLS, TURN_KWARGS, cut=frozenset({5, 9}))
    assert [t.ids for t in cut] == [t.ids for t in whole]
    increment = qwen3.render_continuation(CONVERSATION[6:7], TOOLS, previous_ended_with_eos=False)
    assert increment[0] == qwen3.stop_token_ids[0]
    assert increment[1:] == qwen3.render_continuation(CONVERSATION[6:7], TOOLS, previous_ended_with_eos=True)


def test_system_message_mid_conversation(qwen3: ChatRenderer) -> None:
    new = [{"role": "system", "content": "Budget is 50 EUR."}, {"role": "user", "content": "Go on."}]
    text = qwen3.tokenizer.decode(qwen3.render_continuation(new, TOOLS, previous_ended_with_eos=True))
    assert text == (
        "\n<|im_start|>system\nBudget is 50 EUR.<|im_end|>\n"
        "<|im_start|>user\nGo on.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_chatml_ledger_equals_full_render_every_turn(chatml: ChatRenderer) -> None:
    # SmolLM2's ChatML template is append-only and ignores tool_calls: the ledger must equal the
    # tokenized full render at every turn, consecutive tool messages included.
    kwargs = {a: {} for a in ASSISTANTS}
    for t in simulate(chatml, CONVERSATION, TOOLS, kwargs):
        full = chatml.render_text(CONVERSATION[: t.index], TOOLS, add_generation_prompt=True)
        assert t.ids == chatml.tokenize(full) == chatml.tokenize(t.reference), f"turn at message {t.index}"
    assert chatml.stop_token_ids == [chatml.tokenizer.convert_tokens_to_ids(EOT)]


def test_render_continuation_renders_only_the_increment(qwen3: ChatRenderer, monkeypatch) -> None:
    # A long history: 60 tool-using turns with 2 kB tool results.
    history = [{"role": "system", "content": "sys"}, {"role": "user", "content": "start"}]
    for i in range(60):
        history.append(
            {"role": "assistant", "content": "", "tool_calls": [call(f"c{i}", "get_weather", "{}")]}
        )
        history.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"result {i} " + "x" * 2000})
    history.append({"role": "assistant", "content": "", "tool_calls": [call("last", "get_weather", "{}")]})
    new = [{"role": "tool", "tool_call_id": "last", "content": "fresh result"}]

    rendered: list[tuple[int, int]] = []  # (messages, characters of content) per template render
    encoded: list[int] = []  # characters per tokenizer call
    render = jinja2.Template.render

    def spy_render(self, *args, **kwargs):
        msgs = kwargs["messages"]
        # str.__len__: the increment cache's placeholders note a plain len() as a read of their text
        rendered.append((len(msgs), sum(str.__len__(m.get("content", "")) for m in msgs)))
        return render(self, *args, **kwargs)

    tokenize = ChatRenderer.tokenize

    def spy_tokenize(self, text):
        encoded.append(len(text))
        return tokenize(self, text)

    monkeypatch.setattr(jinja2.Template, "render", spy_render)
    monkeypatch.setattr(ChatRenderer, "tokenize", spy_tokenize)

    anchor = {"role": "user", "content": "the last question"}
    first = qwen3.render_continuation(new, TOOLS, previous_ended_with_eos=True, anchor_user=anchor)
    # The real render, then the two placeholder renders that make the shape's skeleton.
    assert rendered[0] == (3, len(anchor["content"]) + len(SENTINEL) + len("fresh result"))
    assert len(rendered) == 3 and all(n == 3 for n, _ in rendered)
    assert encoded and max(encoded) < 200  # the increment's text only
    # The next tool result of the same shape is filled into the skeleton: no render at all.
    rendered.clear()
    again = {**new[0], "tool_call_id": "next", "content": "another result"}
    second = qwen3.render_continuation([again], TOOLS, previous_ended_with_eos=True, anchor_user=anchor)
    assert rendered == []
    assert qwen3.tokenizer.decode(second) == qwen3.tokenizer.decode(first).replace("fresh", "another")

    # The spies do see a whole history when one is rendered.
    rendered.clear()
    encoded.clear()
    qwen3.render_prompt(history, TOOLS)
    assert rendered[0][0] == len(history) and rendered[0][1] > 120_000
    assert max(encoded) > 120_000


def test_normalize_accepts_openai_shapes(qwen3: ChatRenderer) -> None:
    raw = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            "name": None,
        },
        {"role": "assistant", "content": None, "tool_calls": [call("c", "get_weather", '{"city": "Paris"}')]},
        {"role": "assistant", "content": "x", "tool_calls": [call("d", "get_weather", "not json")]},
    ]
    before = copy.deepcopy(raw)
    out = qwen3.normalize(raw)
    assert raw == before  # inputs untouched
    assert out[0] == {"role": "user", "content": "a\nb"}
    assert out[1]["content"] == ""
    assert out[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert out[2]["tool_calls"][0]["function"]["arguments"] == "not json"


def test_raw_openai_messages_break_the_template_but_render_after_normalizing(qwen3: ChatRenderer) -> None:
    # Why normalize exists: the Qwen3 template fails on a tool-call-only assistant (content None)
    # and on list content, and the renderer handles both.
    foreign = [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {"role": "assistant", "content": None, "tool_calls": [call("c", "get_weather", '{"city":"Paris"}')]},
        {"role": "tool", "tool_call_id": "c", "content": "sunny"},
        {"role": "user", "content": "thanks"},
    ]
    with pytest.raises(Exception):  # noqa: B017 - whatever the template trips over
        qwen3.tokenizer.apply_chat_template(foreign, tokenize=False, add_generation_prompt=True)
    text = qwen3.tokenizer.decode(qwen3.render_prompt(foreign, TOOLS))
    # A JSON-string argument is rendered as the template renders a mapping (canonical tojson).
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "<|im_start|>user\nweather?<|im_end|>" in text


@pytest.mark.parametrize(
    ("content", "param"),
    [
        ([{"type": "image_url", "image_url": {"url": "data:"}}], "messages[0].content"),
        (42, "messages[0].content"),
    ],
)
def test_unsupported_content_is_a_400(qwen3: ChatRenderer, content, param) -> None:
    with pytest.raises(InvalidRequest) as info:
        qwen3.render_prompt([{"role": "user", "content": content}], None)
    assert info.value.status == 400 and info.value.param == param


def test_reserved_template_kwargs_are_a_400(qwen3: ChatRenderer) -> None:
    user = [{"role": "user", "content": "hi"}]
    with pytest.raises(InvalidRequest, match="tokenize") as info:
        qwen3.render_continuation(user, None, previous_ended_with_eos=True, tokenize=True)
    assert info.value.param == "chat_template_kwargs"
    with pytest.raises(InvalidRequest, match="messages"):
        qwen3.render_continuation(user, None, previous_ended_with_eos=True, messages=[])


def test_template_refusal_is_a_400() -> None:
    template = (
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    r = ChatRenderer(qwen3_tokenizer(), TemplateConfig(chat_template=template))
    with pytest.raises(InvalidRequest, match="no tools here"):
        r.render_continuation([{"role": "tool", "content": "x"}], None, previous_ended_with_eos=True)
    with pytest.raises(InvalidRequest, match="role"):
        r.render_prompt([{"content": "no role"}], None)


def test_chat_template_override_and_its_stop_tokens(tmp_path) -> None:
    # A template closing turns with <|endoftext|>: that becomes the end-of-turn token, EOS follows.
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|endoftext|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    path = tmp_path / "t.jinja"
    path.write_text(template)
    assert read_chat_template(str(path)) == template == read_chat_template(template)
    with pytest.raises(ValueError, match="neither"):
        read_chat_template(str(tmp_path / "missing.jinja"))
    r = ChatRenderer(qwen3_tokenizer(), TemplateConfig(chat_template=read_chat_template(str(path))))
    tok = r.tokenizer
    assert r.stop_token_ids == [tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids(EOT)]
    text = tok.decode(
        r.render_continuation([{"role": "user", "content": "q"}], None, previous_ended_with_eos=True)
    )
    assert text == "\n<|im_start|>user\nq<|endoftext|>\n<|im_start|>assistant\n"


def test_templates_the_ledger_cannot_follow_are_refused_at_construction() -> None:
    bare = AutoTokenizer.from_pretrained(qwen3_tokenizer().name_or_path)
    bare.chat_template = None
    with pytest.raises(TemplateIncompatible, match="no chat template"):
        ChatRenderer(bare)
    # Turns closed by plain text: a sampled stop token cannot be matched to the turn's end.
    plain = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n\n{% endfor %}"
    with pytest.raises(TemplateIncompatible, match="special token"):
        ChatRenderer(qwen3_tokenizer(), TemplateConfig(chat_template=plain))
