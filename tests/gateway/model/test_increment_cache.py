"""Increments filled into skeletons: equal to the template's render, or not used.

Templates here run in a sandboxed Jinja environment set up as transformers sets up chat templates;
each is compared with its own render for contents chosen to make a content-reading template
render differently. The end-to-end tests (test_scenarios, test_fidelity) run the real Qwen3 and
ChatML templates through the cache.
"""

from __future__ import annotations

import logging
import random

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from rlgw.gateway.errors import InvalidRequest
from rlgw.gateway.model import render as render_module
from rlgw.gateway.model.increment_cache import IncrementCache, build_skeleton, guarded_template
from rlgw.gateway.model.render import ChatRenderer, TemplateConfig
from tests.support.real_tokenizers import chatml_tokenizer, qwen3_tokenizer

ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
TURN = "<|im_start|>{{ m.role }}\n{CONTENT}<|im_end|>\n"
CONTENTS = [
    "plain result",
    "",
    "  padded  \n",
    'ERROR: <tool_response>x</tool_response> & "quoted" {{ not jinja }}',
    "one two three four five six",
    "ünïcödé ✓ 日本語\ttab",
]


class Template:
    """A template whose message text is written as `content_expr`: its render, and the guarded
    copy's render (what the renderer hands the cache for placeholder renders)."""

    def __init__(self, content_expr: str) -> None:
        source = "{% for m in messages %}" + TURN.replace("{CONTENT}", content_expr) + "{% endfor %}"
        self._plain, self._guarded = ENV.from_string(source), guarded_template(ENV, source)

    def __call__(self, messages: list[dict]) -> str:
        return self._plain.render(messages=messages)

    def guarded(self, messages: list[dict]) -> str:
        return self._guarded.render(messages=messages)

    def text(self, cache: IncrementCache, context: str, messages: list[dict]) -> str:
        return cache.text(context, messages, self, self.guarded)


def tool(content: str, call_id: str = "call_1") -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def test_a_template_that_only_writes_the_text_is_filled_for_every_content() -> None:
    render = Template(
        '{{ "[%s] " % m.role }}{{ "<" ~ m.role ~ ">" }}{{ m.content | string }} [{{ m.tool_call_id }}]'
        "{% if m.name is defined %}!{% endif %}"
    )
    cache = IncrementCache()
    for i, content in enumerate(CONTENTS):
        messages = [tool(content, f"call_{i}"), tool(content[::-1], f"call_{i}b")]
        assert render.text(cache, "ctx", messages) == render(messages)
    assert len(cache) == 1 and cache.usable() == 1


@pytest.mark.parametrize(
    "content_expr",
    [
        "{{ m.content | trim }}",  # a method (strip)
        "{% if m.content.startswith('ERROR') %}!{% endif %}{{ m.content }}",
        "{% if m.content %}{{ m.content }}{% else %}(empty){% endif %}",  # truth
        "{{ m.content | length }}:{{ m.content }}",  # len, in a filter
        "{{ m.content[:3] }}",  # indexing
        "{% if '<tool_response>' in m.content %}T{% endif %}{{ m.content }}",  # contains
        "{% if m.content == '' %}(empty){% endif %}{{ m.content }}",  # comparison
        "{% if m.content is eq('') %}(empty){% endif %}{{ m.content }}",  # a test
        "{{ m.content | upper }}",
        "{{ m.content | int }}:{{ m.content }}",  # a filter that parses the text in C
        "{{ m.content | wordcount }} words: {{ m.content }}",
        # read in C, and both spellings and the first content alike: only the guard sees it
        "{% if m.content | wordcount > 100 %}long: {% endif %}{{ m.content }}",
        "{{ m.content | tojson }}",
        "{{ m.content | e }}",  # HTML escaping
        "{% set c = '' + m.content %}{% if c.endswith(' ') %}_{% endif %}{{ c }}",  # a sum is still the value
        "{% set c = m.content + '' %}{% if c.endswith('\\n') %}_{% endif %}{{ c }}",
        "{{ m.content ~ (m.content ~ '') | wordcount }}",  # `~` keeps the value a placeholder
        "{% if (m.content ~ '').startswith('ERROR') %}!{% endif %}{{ m.content }}",
        '{{ "%-30s|" % m.content }}',  # padded by its length, read in C
        # cut in C: both spellings and the first content alike, so only the `%` guard sees it
        '{% if ("%.5s" % m.content) == "ERROR" %}!{% endif %}{{ m.content }}',
        '{% if ("%.5s" % (m.content,)) == "ERROR" %}!{% endif %}{{ m.content }}',
        '{{ "{:>30}|".format(m.content) }}',
        "{{ ([m.content] | join) | wordcount }} {{ m.content }}",  # a copy: the spellings differ
        # written out changed: a list holding the value goes through tojson unguarded
        "{{ (messages | tojson)[:0] }}{{ m.content | safe }}{{ [m.content] | tojson }}",
    ],
)
def test_a_template_that_reads_the_text_is_always_rendered(content_expr: str) -> None:
    render = Template(content_expr)
    cache = IncrementCache()
    for content in [*CONTENTS, "42", "word " * 120]:
        assert render.text(cache, "ctx", [tool(content)]) == render([tool(content)])
    assert cache.usable() == 0


def test_a_read_no_check_sees_is_caught_by_the_first_render_or_the_sampled_ones(caplog) -> None:
    # A read of a copy made in C (`join` gets a list, not the value): nothing stops the placeholder
    # render, and both spellings render alike (neither holds "ERROR").
    render = Template("{% if ([m.content] | join).startswith('ERROR') %}!{% endif %}{{ m.content }}")
    first = IncrementCache()
    assert render.text(first, "ctx", [tool("ERROR: x")]) == render([tool("ERROR: x")])
    assert first.usable() == 0  # the first use is compared with the real render
    cache = IncrementCache(verify_every=4)
    outputs = [render.text(cache, "ctx", [tool(c)]) for c in ["ok", "fine", "good", "ERROR: y"]]
    assert cache.usable() == 1  # "ok" kept it; the next three were filled
    with caplog.at_level(logging.ERROR, logger="rlgw.gateway.model.increment_cache"):
        caught = render.text(cache, "ctx", [tool("ERROR: z")])  # the 4th fill is verified
    assert outputs[:3] == [render([tool(c)]) for c in ["ok", "fine", "good"]]
    assert caught == render([tool("ERROR: z")]) and cache.usable() == 0
    assert "differs" in caplog.text


def test_shapes_are_told_apart_by_roles_keys_and_non_string_values() -> None:
    render = Template("{{ m.content }}{% if m.name is defined %} ({{ m.name }}){% endif %}")
    cache = IncrementCache()
    user = {"role": "user", "content": "hi"}
    for messages in (
        [tool("a")],
        [user],
        [tool("a"), user],
        [{**tool("a"), "name": "bash"}],
        [{**tool("a"), "extra": 1}],
        [{**tool("a"), "extra": 2}],
    ):
        assert render.text(cache, "ctx", messages) == render(messages)
        assert render.text(cache, "other", messages) == render(messages)
    assert len(cache) == 12 and cache.usable() == 12


def test_the_least_recently_used_shape_goes_first() -> None:
    render = Template("{{ m.content }}")
    cache = IncrementCache(size=2)
    for ctx in ("a", "b", "a", "c"):
        render.text(cache, ctx, [tool("x")])
    assert len(cache) == 2
    renders: list[str] = []

    def counted(ctx: str) -> None:
        cache.text(ctx, [tool("y")], lambda m: renders.append(ctx) or render(m), render.guarded)

    counted("c")  # the newest: kept
    counted("a")  # used since "b": kept
    assert renders == []
    counted("b")  # the least recently used went when "c" came
    assert renders == ["b"]


def test_a_placeholder_written_out_in_part_leaves_no_skeleton() -> None:
    # Both spellings cut to the same marked prefix: alike, but not the value written out.
    def cut(messages: list[dict]) -> str:
        return "<" + str(messages[0]["content"])[1:20] + ">"

    assert build_skeleton(cut, [tool("x")]) is None
    whole = build_skeleton(lambda messages: "<" + messages[0]["content"] + ">", [tool("x")])
    assert whole is not None and whole.fill(["x", "ok"]) == "<ok>"


def test_without_transformers_compiled_templates_increments_are_rendered(monkeypatch) -> None:
    monkeypatch.setattr(render_module, "_compile_jinja_template", None)
    r = ChatRenderer(qwen3_tokenizer(), TemplateConfig())
    renders: list[int] = []
    render = jinja2.Template.render
    monkeypatch.setattr(jinja2.Template, "render", lambda *a, **k: renders.append(1) or render(*a, **k))
    got = [r.render_continuation([tool(c)], None, previous_ended_with_eos=True) for c in ("a", "b", "c")]
    assert len(renders) == 3  # one real render each, no placeholder renders
    monkeypatch.undo()
    fresh = ChatRenderer(qwen3_tokenizer(), TemplateConfig())
    assert got == [
        fresh.render_continuation([tool(c)], None, previous_ended_with_eos=True) for c in ("a", "b", "c")
    ]


def test_a_placeholder_render_that_fails_otherwise_leaves_no_skeleton(caplog) -> None:
    def broken(messages: list[dict]) -> str:
        raise RuntimeError("a bug in the copy")

    with caplog.at_level(logging.WARNING, logger="rlgw.gateway.model.increment_cache"):
        assert build_skeleton(broken, [tool("x")]) is None
    assert "RuntimeError: a bug in the copy" in caplog.text


def test_a_template_error_leaves_no_skeleton() -> None:
    def refuse(messages: list[dict]) -> str:
        raise InvalidRequest("roles must alternate")

    assert build_skeleton(refuse, [tool("x")]) is None


def test_qwen3_tool_results_are_filled_and_equal_the_render(monkeypatch) -> None:
    def renderer() -> ChatRenderer:
        return ChatRenderer(qwen3_tokenizer(), TemplateConfig())

    anchor = {"role": "user", "content": "fix the bug"}
    turns = [[tool(content, f"call_{i}")] for i, content in enumerate(CONTENTS * 2)]
    # Each expected increment from a fresh renderer, whose first render is a real one.
    expected = [
        renderer().render_continuation(new, None, previous_ended_with_eos=True, anchor_user=anchor)
        for new in turns
    ]
    cached = renderer()
    renders = []
    render = jinja2.Template.render
    monkeypatch.setattr(jinja2.Template, "render", lambda *a, **k: renders.append(1) or render(*a, **k))
    got = [
        cached.render_continuation(new, None, previous_ended_with_eos=True, anchor_user=anchor)
        for new in turns
    ]
    assert got == expected
    assert len(renders) == 3  # the first turn: its render and the skeleton's two; then fills only
    # A user message's text Qwen3 reads (is it a wrapped tool response?): rendered every time.
    user = [{"role": "user", "content": "<tool_response>not a query</tool_response>"}]
    for _ in range(2):
        renders.clear()
        ids = cached.render_continuation(user, None, previous_ended_with_eos=True, anchor_user=anchor)
        assert renders
    monkeypatch.undo()
    assert ids == renderer().render_continuation(user, None, previous_ended_with_eos=True, anchor_user=anchor)


@pytest.mark.parametrize("tokenizer", ["qwen3", "chatml"])
def test_random_increments_filled_or_rendered_equal_a_fresh_render(tokenizer: str) -> None:
    """Random increments (tool results, user turns, named tools, agent-written assistant turns with
    calls and reasoning) over a few anchors and kwargs: the cached renderer's ids equal a renderer
    that has never seen the shape (its render is a real one)."""
    make = qwen3_tokenizer if tokenizer == "qwen3" else chatml_tokenizer
    rng = random.Random(7)
    words = [
        "ls",
        "-la",
        "ERROR",
        "<tool_response>",
        "  ",
        "\n",
        "日本",
        "&amp;",
        '"q"',
        "{{x}}",
        "</think>",
        "ok",
    ]

    def text() -> str:
        return "".join(rng.choice(words) + rng.choice(["", " ", "\n"]) for _ in range(rng.randrange(0, 12)))

    def message() -> dict:
        kind = rng.choice(["tool", "tool", "tool", "named", "user", "assistant"])
        if kind in ("tool", "named"):
            m = tool(text(), f"call_{rng.randrange(10**6)}")
            return {**m, "name": "bash"} if kind == "named" else m
        if kind == "user":
            return {"role": "user", "content": text()}
        call = {
            "id": "c1",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"command": "ls"}'},
        }
        return {"role": "assistant", "content": text(), "reasoning_content": text(), "tool_calls": [call]}

    cached = ChatRenderer(make(), TemplateConfig())
    anchors = [
        None,
        {"role": "user", "content": "fix the bug"},
        {"role": "user", "content": "<tool_response>x</tool_response>"},
    ]
    for _ in range(100):
        new = [message() for _ in range(rng.choice([1, 1, 1, 2, 3]))]
        anchor, eos = rng.choice(anchors), rng.random() < 0.8
        kw = rng.choice([{}, {"enable_thinking": False}])
        args = dict(previous_ended_with_eos=eos, anchor_user=anchor, **kw)
        try:
            want = ChatRenderer(make(), TemplateConfig()).render_continuation(new, None, **args)
        except InvalidRequest:
            with pytest.raises(InvalidRequest):
                cached.render_continuation(new, None, **args)
            continue
        assert cached.render_continuation(new, None, **args) == want, (new, anchor, eos, kw)
