"""Output parsing: SGLang's reasoning and tool-call formats, errors, and chunking invariance."""

from __future__ import annotations

import json
import random

import pytest

from rlgw.gateway.parsing.detokenize import IncrementalDetokenizer
from rlgw.gateway.parsing.output_parser import OutputParser, ParsedOutput, ParserEvent, ToolCall
from rlgw.gateway.parsing.reasoning import detect_reasoning
from rlgw.gateway.parsing.tool_calls import (
    convert_value,
    detect_tool_format,
    normalize_tool_format,
)
from tests.support.real_tokenizers import qwen3_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "configure",
            "parameters": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "ratio": {"type": "number"},
                    "count": {"type": "integer"},
                    "enabled": {"type": "boolean"},
                    "options": {"type": "object"},
                    "tags": {"type": "array"},
                    "maybe": {"type": ["integer", "null"]},
                    "anything": {"type": ["integer", "string"]},
                    "untyped": {"description": "no type"},
                },
            },
        },
    },
]


def parse(text: str, chunks: list[str] | None = None, **kw) -> tuple[list[ParserEvent], ParsedOutput]:
    """Feed `text` (as `chunks` when given), close, and return all events and the result."""
    kw.setdefault("tool_format", None)
    kw.setdefault("tools", TOOLS if kw["tool_format"] else None)
    kw.setdefault("reasoning", False)
    kw.setdefault("reasoning_forced", False)
    parser = OutputParser(**kw)
    events: list[ParserEvent] = []
    for piece in chunks if chunks is not None else [text]:
        events += parser.feed(piece)
    events += parser.close()
    return events, parser.result()


def joined(events: list[ParserEvent], kind: str) -> str:
    return "".join(e.text for e in events if e.kind == kind)


def calls(result: ParsedOutput) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in result.tool_calls]


# --- reasoning (qwen3) ------------------------------------------------------------------------


def test_reasoning_then_answer_strips_think_markup_and_separator():
    _, r = parse("<think>\nI should greet.\n</think>\n\nHello there!", reasoning=True)
    assert r.reasoning_content == "I should greet."
    assert r.content == "Hello there!"


def test_not_forced_without_think_is_all_content_even_with_a_later_end_marker():
    _, r = parse("Plain answer. </think> still content", reasoning=True)
    assert r.reasoning_content is None
    assert r.content == "Plain answer. </think> still content"


def test_forced_without_think_start_still_splits_at_end_marker():
    _, r = parse("step one\nstep two\n</think>\n\nThe answer is 4.", reasoning=True, reasoning_forced=True)
    assert r.reasoning_content == "step one\nstep two"
    assert r.content == "The answer is 4."


def test_forced_with_a_leading_think_start_strips_it():
    _, r = parse("<think>\nhmm\n</think>ok", reasoning=True, reasoning_forced=True)
    assert (r.reasoning_content, r.content) == ("hmm", "ok")


@pytest.mark.parametrize("forced", [False, True])
def test_no_end_marker_means_everything_is_reasoning(forced):
    text = "still thinking when the budget ran out" if forced else "<think>\nstill thinking"
    _, r = parse(text, reasoning=True, reasoning_forced=forced)
    assert r.content == ""
    assert r.reasoning_content == text.removeprefix("<think>\n")


def test_tool_call_ends_reasoning_without_end_marker():
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    text = "<think>\nI need the weather.\n" + call
    _, r = parse(text, reasoning=True, tool_format="qwen25")
    assert r.reasoning_content == "I need the weather."
    assert r.content == ""
    assert calls(r) == [("get_weather", {"city": "Oslo"})]


def test_tool_call_inside_reasoning_is_reasoning_when_tools_are_off():
    text = '<think>a <tool_call>{"name": "x"}</tool_call> b</think>done'
    _, r = parse(text, reasoning=True, tool_format=None)
    assert r.reasoning_content == 'a <tool_call>{"name": "x"}</tool_call> b'
    assert r.content == "done"


def test_empty_reasoning_is_none():
    _, r = parse("<think>\n\n</think>\n\nHi", reasoning=True)
    assert r.reasoning_content is None
    assert r.content == "Hi"


def test_reasoning_off_passes_text_verbatim():
    text = "  <think>x</think> spaced \n"
    _, r = parse(text)
    assert r.content == text and r.reasoning_content is None


# --- qwen25 / hermes (JSON) -------------------------------------------------------------------


def test_qwen25_parallel_calls_keep_order_and_strip_content():
    text = (
        "Let me check both.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "parameters": {"city": "Zürich"}}\n</tool_call>'
    )
    events, r = parse(text, tool_format="qwen25")
    assert r.content == "Let me check both."
    assert calls(r) == [("get_weather", {"city": "Paris", "days": 3}), ("get_weather", {"city": "Zürich"})]
    assert [c.index for c in r.tool_calls] == [0, 1]
    assert r.tool_calls[1].arguments == '{"city": "Zürich"}'  # ensure_ascii=False, SGLang separators
    assert _kinds(events) == ["content", "tool_call", "tool_call"]
    assert r.errors == []


def test_qwen25_text_after_calls_is_kept_as_content():
    text = 'A\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>\nDone.'
    _, r = parse(text, tool_format="qwen25")
    assert r.content == "A\n\nDone."
    assert len(r.tool_calls) == 1


def test_hermes_without_newlines_and_list_json():
    text = (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Lima"}}</tool_call>'
        '<tool_call>[{"name": "get_weather", "arguments": {"city": "Quito"}}, '
        '{"name": "configure", "arguments": "{\\"count\\": 2}"}]</tool_call>'
    )
    _, r = parse(text, tool_format="hermes")
    assert calls(r) == [
        ("get_weather", {"city": "Lima"}),
        ("get_weather", {"city": "Quito"}),
        ("configure", {"count": 2}),  # arguments serialized twice by the model are accepted
    ]
    assert [c.index for c in r.tool_calls] == [0, 1, 2]


def test_hermes_accepts_an_unterminated_last_call():
    text = 'ok <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    _, r = parse(text, tool_format="hermes")
    assert r.content == "ok"
    assert calls(r) == [("get_weather", {"city": "Oslo"})]
    assert r.errors == []


@pytest.mark.parametrize(
    ("fmt", "body"),
    [
        ("hermes", '{"name": "get_wea'),  # cut before its head was known: nothing of it streamed
        ("qwen25", '{"name": "get_weather", "argu'),
        ("qwen3_coder", "<function=get_weather>"),  # this format never streams a call
    ],
)
def test_unterminated_incomplete_call_becomes_content_and_is_flagged(fmt, body):
    text = "Checking.\n<tool_call>\n" + body
    events, r = parse(text, tool_format=fmt, chunks=[text[:-3], text[-3:]])
    assert r.errors[0].kind == "unterminated" and r.errors[0].raw == "<tool_call>\n" + body
    assert joined(events, "content") == r.content
    assert r.tool_calls == [] and r.content == "Checking.\n<tool_call>\n" + body
    assert len(r.errors) == 1


@pytest.mark.parametrize("fmt", ["hermes", "qwen25"])
@pytest.mark.parametrize("end", ["", "\n</tool_call>"])
def test_a_call_cut_inside_its_streamed_arguments_stays_the_call_the_agent_was_sent(fmt, end):
    # What tiny-agent did under Claude Code: a stop token (or the length limit) inside the arguments.
    # The agent already holds the call; as content too it would hold both and its echo (the call,
    # by id) would match nothing the ledger minted.
    args = '{"command": "echo hello > hello.txt'
    text = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": ' + args + end
    events, r = parse(text, tool_format=fmt, chunks=[text[:40], text[40:-3], text[-3:]])
    assert r.tool_calls == [ToolCall(0, "get_weather", args + end.removesuffix("</tool_call>"))]
    assert streamed(events) == r.tool_calls
    assert r.content == "Checking." and joined(events, "content") == r.content
    assert r.errors[-1].kind == "streamed_call_mismatch" and "already streamed" in r.errors[-1].detail


def test_qwen25_unterminated_complete_json_is_still_unterminated():
    # The call's head and arguments streamed as sampled: it stays the call the agent was sent.
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
    events, r = parse(text, tool_format="qwen25")
    assert calls(r) == [("get_weather", {"city": "Oslo"})] and streamed(events) == r.tool_calls
    assert [e.kind for e in r.errors] == ["unterminated", "streamed_call_mismatch"]


def test_a_block_that_opens_no_json_goes_out_as_content_at_once():
    p = OutputParser(tool_format="qwen25", tools=TOOLS, reasoning=False, reasoning_forced=False)
    # Not held until a </tool_call> that may never come: the stream does not go silent.
    assert p.feed("Hi <tool_call>\n") == [ParserEvent("content", "Hi")]
    assert p.feed("windy report") == [ParserEvent("content", " <tool_call>\nwindy report")]
    p.close()
    r = p.result()
    assert r.content == "Hi <tool_call>\nwindy report" and r.tool_calls == []
    assert [e.kind for e in r.errors] == ["invalid_json"]


def test_a_streamed_call_whose_arguments_do_not_parse_stays_a_call_and_is_flagged():
    block = '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>'
    events, r = parse(f"Hi\n{block}", tool_format="qwen25")
    assert r.content == "Hi" and r.tool_calls == [ToolCall(0, "get_weather", '{"city": }')]
    assert streamed(events) == r.tool_calls
    assert [e.kind for e in r.errors] == ["invalid_json", "streamed_call_mismatch"]


@pytest.mark.parametrize(
    ("block", "kind"),
    [
        ('{"name": "get_weather" "arguments": {"city": "Oslo"}}', "invalid_json"),
        ('{"arguments": {"city": "Oslo"}}', "bad_call"),
        ("[]", "bad_call"),
        ('{"name": "get_weather", "arguments": [1, 2]}', "bad_arguments"),
        ('{"name": "get_weather", "arguments": "not json"}', "bad_arguments"),
    ],
)
def test_invalid_json_block_is_returned_as_content_and_flagged(block, kind):
    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    bad = f"<tool_call>\n{block}\n</tool_call>"
    events, r = parse(f"Hi\n{good}\n{bad}", tool_format="qwen25")
    assert calls(r) == [("get_weather", {"city": "Oslo"})]  # the good call is still made
    assert r.content == f"Hi\n\n{bad}"
    assert [(e.kind, e.raw) for e in r.errors] == [(kind, bad)]
    assert _kinds(events) == ["content", "tool_call", "content"]


def test_one_bad_item_in_a_list_turns_the_whole_block_into_content():
    block = '<tool_call>[{"name": "get_weather", "arguments": {}}, {"oops": 1}]</tool_call>'
    _, r = parse(block, tool_format="hermes")
    assert r.tool_calls == [] and r.content == block and r.errors[0].kind == "bad_call"


@pytest.mark.parametrize("fmt", ["hermes", "qwen25", "qwen3_coder"])
def test_unknown_tool_is_kept_as_a_call_and_flagged(fmt):
    if fmt == "qwen3_coder":
        block = "<tool_call>\n<function=launch>\n<parameter=target>\nmoon\n</parameter>\n</function>\n"
        block += "</tool_call>"
    else:
        block = '<tool_call>\n{"name": "launch", "arguments": {"target": "moon"}}\n</tool_call>'
    _, r = parse(block, tool_format=fmt)
    assert calls(r) == [("launch", {"target": "moon"})]
    assert [(e.kind, e.raw) for e in r.errors] == [("unknown_tool", block)]
    assert r.content == ""


@pytest.mark.parametrize("fmt", ["hermes", "qwen25", "qwen3_coder"])
def test_without_tools_tool_call_markup_is_plain_content(fmt):
    text = 'x <tool_call>{"name": "get_weather"}</tool_call>'
    _, r = parse(text, tool_format=fmt, tools=[])
    assert r.content == text and r.tool_calls == [] and r.errors == []
    _, r = parse(text, tool_format=None)
    assert r.content == text


# --- qwen3_coder (XML) ------------------------------------------------------------------------

QWEN3_CODER_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)


def test_qwen3_coder_reference_example():
    _, r = parse("I'll look.\n" + QWEN3_CODER_CALL, tool_format="qwen3_coder")
    assert r.content == "I'll look."
    assert r.tool_calls[0].name == "get_weather"
    assert r.tool_calls[0].arguments == '{"city": "Paris", "days": 3}'
    assert r.errors == []


def test_qwen3_coder_multi_param_type_conversion():
    params = {
        "name": "  two spaces kept ",
        "ratio": "0.5",
        "count": "7",
        "enabled": "True",
        "options": '{"a": [1, 2], "b": null}',
        "tags": "['x', 'y']",  # not JSON: literal-eval fallback
        "maybe": "null",
        "anything": "42",
        "untyped": "17",
    }
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    text = f"<tool_call>\n<function=configure>\n{body}</function>\n</tool_call>"
    _, r = parse(text, tool_format="qwen3_coder")
    assert calls(r) == [
        (
            "configure",
            {
                "name": "  two spaces kept ",
                "ratio": 0.5,
                "count": 7,
                "enabled": True,
                "options": {"a": [1, 2], "b": None},
                "tags": ["x", "y"],
                "maybe": None,
                "anything": 42,
                "untyped": "17",
            },
        )
    ]
    assert r.errors == []


def test_qwen3_coder_multiline_value_keeps_inner_newlines():
    text = (
        "<tool_call>\n<function=configure>\n<parameter=name>\n\nline 1\nline 2\n\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    _, r = parse(text, tool_format="qwen3_coder")
    assert calls(r)[0][1] == {"name": "\nline 1\nline 2\n"}


def test_qwen3_coder_parameter_ends_at_next_parameter_or_function_end():
    text = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n<parameter=days>\n4\n"
        "</function>\n</tool_call>"
    )
    _, r = parse(text, tool_format="qwen3_coder")
    assert calls(r) == [("get_weather", {"city": "Paris", "days": 4})]


def test_qwen3_coder_parallel_calls_in_separate_blocks_and_one_block():
    two_blocks = QWEN3_CODER_CALL + "\n" + QWEN3_CODER_CALL.replace("Paris", "Berlin")
    _, r = parse(two_blocks, tool_format="qwen3_coder")
    assert [a["city"] for _, a in calls(r)] == ["Paris", "Berlin"]
    one_block = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n</function>\n"
        "<function=get_weather>\n<parameter=city>\nB\n</parameter>\n</function>\n</tool_call>"
    )
    _, r = parse(one_block, tool_format="qwen3_coder")
    assert [(c.index, json.loads(c.arguments)["city"]) for c in r.tool_calls] == [(0, "A"), (1, "B")]


def test_qwen3_coder_bad_values_and_unknown_parameters_are_kept_as_strings_and_flagged():
    text = (
        "<tool_call>\n<function=configure>\n<parameter=count>\nmany\n</parameter>\n"
        "<parameter=enabled>\nyes\n</parameter>\n<parameter=options>\n{oops\n</parameter>\n"
        "<parameter=color>\nred\n</parameter>\n</function>\n</tool_call>"
    )
    _, r = parse(text, tool_format="qwen3_coder")
    assert calls(r) == [
        ("configure", {"count": "many", "enabled": "yes", "options": "{oops", "color": "red"})
    ]
    assert [e.kind for e in r.errors] == ["bad_value", "bad_value", "bad_value", "unknown_parameter"]
    assert all(e.raw == text for e in r.errors)


@pytest.mark.parametrize(
    "inner",
    ["just text", "<function=>\n</function>", "<function=get_weather>\n<parameter=city\nParis\n</function>"],
)
def test_qwen3_coder_malformed_block_is_content(inner):
    block = f"<tool_call>\n{inner}\n</tool_call>"
    _, r = parse(block, tool_format="qwen3_coder")
    assert r.tool_calls == [] and r.content == block and [e.kind for e in r.errors] == ["bad_call"]


def test_convert_value_never_evaluates_code():
    value, problem = convert_value("__import__('os').getpid()", {"type": "object"})
    assert value == "__import__('os').getpid()" and problem
    # A Python literal that is not JSON (a set) is refused too.
    assert convert_value("{1, 2}", {"type": "array"}) == ("{1, 2}", "'{1, 2}' is not a valid array")
    assert convert_value("3", {"type": "number"}) == (3, None)
    assert convert_value("3.0", {"type": "number"}) == (3.0, None)
    assert convert_value("1e3", {"type": "number"}) == (1000.0, None)
    assert convert_value("NULL", {"type": "string"}) == (None, None)


# --- detection and names ----------------------------------------------------------------------


def test_detection_on_the_real_qwen3_template():
    template = qwen3_tokenizer().chat_template
    assert detect_tool_format(template) == "qwen25"
    assert detect_reasoning(template)


def test_detection_of_other_templates():
    assert detect_tool_format("... <tool_call>\n<function=example_function_name>\n...") == "qwen3_coder"
    assert detect_tool_format("wrap calls in <tool_call></tool_call> tags") == "hermes"
    assert detect_tool_format("{{ '<|im_start|>' + message['role'] }}") is None
    assert detect_tool_format(None) is None
    assert not detect_reasoning("{{ '<|im_start|>' }}")
    assert normalize_tool_format("qwen") == "qwen25"
    with pytest.raises(ValueError, match="unknown tool-call format"):
        OutputParser(tool_format="mistral", tools=TOOLS, reasoning=False, reasoning_forced=False)


# --- streaming --------------------------------------------------------------------------------


def test_streaming_sends_text_early_and_holds_only_a_partial_marker():
    p = OutputParser(tool_format="qwen25", tools=TOOLS, reasoning=True, reasoning_forced=False)
    assert p.feed("<thi") == []  # could still be <think>
    assert p.feed("nk>\nPlan") == [ParserEvent("reasoning", "Plan")]
    assert p.feed(" it </th") == [ParserEvent("reasoning", " it")]  # trailing space waits for more text
    assert p.feed("ink>\n\nAns") == [ParserEvent("content", "Ans")]
    assert p.feed("wer <tool") == [ParserEvent("content", "wer")]
    # A call streams as sampled: its name, then its arguments up to the object's end.
    start, args = p.feed('_call>\n{"name": "get_weather", "arguments": {"city": "X"}}\n</tool')
    assert start.kind == "tool_call_start" and start.call.name == "get_weather"
    # The last characters wait: they could begin </tool_call>.
    assert args == ParserEvent("tool_call_args", '{"city": "', ToolCall(0, "get_weather", ""))
    assert p.feed("_call>") == [ParserEvent("tool_call_args", 'X"}', ToolCall(0, "get_weather", ""))]
    assert p.close() == []
    assert p.result().content == "Answer"


def test_feed_after_close_and_result_before_close_fail_loudly():
    p = OutputParser(tool_format=None, tools=None, reasoning=False, reasoning_forced=False)
    with pytest.raises(RuntimeError):
        p.result()
    p.close()
    with pytest.raises(RuntimeError):
        p.feed("x")


CHUNKING_CASES = [
    ("<think>\nA plan.\n</think>\n\nHello <b>world</b> <tool_call> stays", {"reasoning": True}),
    ("forced reasoning < </thin </think> answer <think> x", {"reasoning": True, "reasoning_forced": True}),
    (
        "<think>\nweather?\n</think>\n\nOK.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris <3 </tool"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{bad json}\n</tool_call>\nTrailing <tool_call>\n{"name"',
        {"reasoning": True, "tool_format": "qwen25"},
    ),
    (
        '  lead <tool_call>[{"name": "get_weather", "arguments": {"city": "日本 🌸"}}]</tool_call> mid '
        '<tool_call>{"name": "configure", "arguments": {"count": 1}}',
        {"tool_format": "hermes"},
    ),
    (
        "forced <tool_call>\n<function=configure>\n<parameter=count>\n5\n</parameter>\n<parameter=tags>\n"
        '["a"]\n</parameter>\n</function>\n</tool_call>\n' + QWEN3_CODER_CALL + "\n<tool_call>\n<function=x",
        {"tool_format": "qwen3_coder", "reasoning": True, "reasoning_forced": True},
    ),
    ("  <  spaces\n\n and <<think> text \n", {}),
]


def _random_chunks(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, min(len(text) - 1, 12))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


@pytest.mark.parametrize(("text", "kw"), CHUNKING_CASES)
def test_any_chunking_gives_the_same_events_and_result(text, kw):
    whole_events, whole = parse(text, **kw)
    assert joined(whole_events, "content") == whole.content
    assert (joined(whole_events, "reasoning") or None) == whole.reasoning_content
    assert streamed(whole_events) == whole.tool_calls
    rng = random.Random(1234)
    chunkings = [list(text)] + [_random_chunks(text, rng) for _ in range(40)]
    for chunks in chunkings:
        events, result = parse(text, chunks, **kw)
        assert result == whole, chunks
        assert joined(events, "content") == whole.content
        assert joined(events, "reasoning") == (whole.reasoning_content or "")
        assert streamed(events) == whole.tool_calls
        # The relative order of kinds is the same (adjacent same-kind text merged).
        assert _kinds(events) == _kinds(whole_events)


def _kinds(events: list[ParserEvent]) -> list[str]:
    """Event kinds, runs of text merged, a streamed call (start, then argument pieces) as one call."""
    out: list[str] = []
    for e in events:
        if e.kind == "tool_call_args":
            continue
        kind = "tool_call" if e.kind == "tool_call_start" else e.kind
        if kind == "tool_call" or not out or out[-1] != kind:
            out.append(kind)
    return out


def streamed(events: list[ParserEvent]) -> list[ToolCall]:
    """The calls as an agent receives them: whole, or named first and their arguments streamed."""
    out: list[ToolCall] = []
    for e in events:
        assert e.call is not None or e.kind not in ("tool_call", "tool_call_start", "tool_call_args")
        if e.kind == "tool_call":
            out.append(e.call)
        elif e.kind == "tool_call_start":
            out.append(ToolCall(e.call.index, e.call.name, ""))
        elif e.kind == "tool_call_args":
            assert out[-1].index == e.call.index
            out[-1].arguments += e.text
    return out


def test_detokenized_qwen3_ids_one_by_one_parse_like_the_whole_text():
    """The gateway's path: sampled ids -> incremental text -> one parser, streamed vs whole."""
    tok = qwen3_tokenizer()
    reply = (
        "<think>\nThe user wants 東京 weather 🌦.\n</think>\n\nChecking.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "東京", "days": 2}}\n</tool_call>'
    )
    ids = [*tok.encode(reply), tok.convert_tokens_to_ids("<|im_end|>")]
    kw = {"tool_format": "qwen25", "tools": TOOLS, "reasoning": True, "reasoning_forced": False}
    detok, parser = IncrementalDetokenizer(tok), OutputParser(**kw)
    events = [e for i in ids for e in parser.feed(detok.feed([i]))]
    events += parser.feed(detok.flush()) + parser.close()
    _, whole = parse(tok.decode(ids, skip_special_tokens=True), **kw)
    assert parser.result() == whole
    assert whole.reasoning_content == "The user wants 東京 weather 🌦."
    assert (whole.content, calls(whole)) == ("Checking.", [("get_weather", {"city": "東京", "days": 2})])
    assert joined(events, "reasoning") == whole.reasoning_content
