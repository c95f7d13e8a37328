"""Constrained decoding (SGLang's `json_schema`, `regex`, `ebnf`, `structural_tag`) with xgrammar.

Over HTTP on the shared engine (the real Qwen3 tokenizer, 151k tokens), and in process on the
padded tiny-qwen3 fixture for a batch that mixes constrained and free requests. The models are
random, so the constraints are bounded (short strings, small integers): the grammar must do all the
work, and every output must parse, match and end on EOS.
"""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import orjson
import pytest

from rlgw.engine.core import Engine
from rlgw.engine.grammar import Constraint, constraint_of
from rlgw.engine.sampling import parse_sampling_params
from tests.engine.conftest import run_requests

PROMPT = [9707, 1052, 11, 1246, 525, 498, 30]
IM_END = 151645
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "ok"],
    "additionalProperties": False,
}
REGEX = r"(yes|no): [0-9]{1,3}"


def parsed(text: str) -> object:
    """The JSON an xgrammar JSON grammar admits. Its rule for the characters of a string with a
    `maxLength` (`Grammar.from_json_schema`, as SGLang gets it) excludes only the quote, the
    backslash, CR and LF, so a raw tab or another control character can appear inside a string:
    parse with `strict=False`, as a client of SGLang must."""
    return json.loads(text, strict=False)


def generate(url: str, sampling_params: dict, **extra) -> httpx.Response:
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 200, **sampling_params}, **extra}
    return httpx.post(f"{url}/generate", json=body, timeout=120)


def test_json_schema_output_is_valid_json_matching_the_schema(engine_url: str) -> None:
    r = generate(engine_url, {"json_schema": json.dumps(SCHEMA), "n": 4, "sampling_seed": 3})
    assert r.status_code == 200, r.text
    outs = r.json()
    texts = {o["text"] for o in outs}
    for out in outs:
        # The grammar ends the request on EOS, which the text leaves out (SGLang's trim).
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": IM_END}
        assert out["output_ids"][-1] == IM_END
        jsonschema.validate(parsed(out["text"]), SCHEMA)
    # n seeded samples are copies (see rlgw.engine.protocol); an unseeded n gives independent ones.
    assert len(texts) == 1
    free = generate(engine_url, {"json_schema": json.dumps(SCHEMA), "n": 3}).json()
    for out in free:
        jsonschema.validate(parsed(out["text"]), SCHEMA)


def test_any_json(engine_url: str) -> None:
    """`$$ANY$$` is SGLang's spelling of OpenAI's `json_object`: any JSON value."""
    r = generate(engine_url, {"json_schema": "$$ANY$$", "sampling_seed": 5, "max_new_tokens": 400})
    assert r.status_code == 200, r.text
    out = r.json()
    if out["meta_info"]["finish_reason"]["type"] == "stop":
        parsed(out["text"])
    else:  # a random model may nest deeper than the budget: what it wrote is still a JSON prefix
        assert out["text"][:1] in "{["


def test_regex_output_matches(engine_url: str) -> None:
    r = generate(engine_url, {"regex": REGEX, "temperature": 1.5, "n": 4})
    assert r.status_code == 200, r.text
    for out in r.json():
        assert re.fullmatch(REGEX, out["text"]), out["text"]
        assert out["meta_info"]["finish_reason"]["type"] == "stop"


def test_ebnf_output_matches(engine_url: str) -> None:
    grammar = 'root ::= "color: " color ("," " "? color)?\ncolor ::= "red" | "green" | "blue"'
    r = generate(engine_url, {"ebnf": grammar, "temperature": 0})
    assert r.status_code == 200, r.text
    assert re.fullmatch(r"color: (red|green|blue)(, ?(red|green|blue))?", r.json()["text"])


def test_structural_tag_output(engine_url: str) -> None:
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "tag",
            "begin": "<answer>",
            "content": {"type": "regex", "pattern": REGEX},
            "end": "</answer>",
        },
    }
    r = generate(engine_url, {"structural_tag": json.dumps(tag), "temperature": 1.5, "n": 3})
    assert r.status_code == 200, r.text
    for out in r.json():
        assert re.fullmatch(f"<answer>{REGEX}</answer>", out["text"]), out["text"]


def test_legacy_structural_tag_compiles_and_accepts_a_tool_call(padded_engine: Engine) -> None:
    """SGLang's older shape: `structures` (begin, schema, end) entered on `triggers`."""
    legacy = {
        "structures": [{"begin": "<tool_call>", "schema": SCHEMA, "end": "</tool_call>"}],
        "triggers": ["<tool_call>"],
    }
    matcher = padded_engine.grammar_matcher(Constraint("structural_tag", json.dumps(legacy)))
    text = 'Sure. <tool_call>{"name": "x", "age": 3, "ok": true}</tool_call>'
    assert all(matcher.accept(t) for t in padded_engine.tokenizer.encode(text))
    bad = padded_engine.grammar_matcher(Constraint("structural_tag", json.dumps(legacy)))
    ids = padded_engine.tokenizer.encode('<tool_call>{"name": 5}')
    assert not all(bad.accept(t) for t in ids)


def test_constrained_logprobs_are_over_the_allowed_tokens(engine_url: str) -> None:
    """The mask comes before the softmax (SGLang's order): a token the grammar forces has logprob 0."""
    r = generate(engine_url, {"regex": "a", "temperature": 1.0}, return_logprob=True)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["text"] == "a" and out["output_ids"][-1] == IM_END  # "a", then the one stop token
    assert [t[0] for t in out["meta_info"]["output_token_logprobs"]] == pytest.approx([0.0, 0.0], abs=1e-5)


@pytest.mark.parametrize(
    ("params", "kind"),
    [
        ({"json_schema": "{not json"}, "json"),
        ({"json_schema": '{"type": 5}'}, "json"),
        ({"regex": "(unclosed"}, "regex"),
        ({"ebnf": "root ::= "}, "ebnf"),
        ({"structural_tag": '{"type": "structural_tag", "format": {"type": "nope"}}'}, "structural_tag"),
    ],
)
def test_invalid_constraint_is_a_400_in_sglang_shape(engine_url: str, params: dict, kind: str) -> None:
    r = generate(engine_url, params)
    assert r.status_code == 400
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message"}
    assert body["error"]["message"].startswith(f"Failed to compile {kind} grammar: ")
    # Streamed, SGLang reports it in the stream: an error event, then [DONE], with status 200.
    with httpx.stream(
        "POST",
        f"{engine_url}/generate",
        json={"input_ids": PROMPT, "sampling_params": params, "stream": True},
        timeout=60,
    ) as s:
        assert s.status_code == 200
        events = [line[len("data: ") :] for line in s.iter_lines() if line]
    assert events[-1] == "[DONE]"
    err = orjson.loads(events[0])["error"]
    assert err["code"] == 400 and err["message"].startswith(f"Failed to compile {kind} grammar: ")


def test_conflicting_or_mistyped_constraints_are_refused(engine_url: str) -> None:
    r = generate(engine_url, {"regex": "a", "json_schema": "{}"})
    assert r.status_code == 400
    assert r.json() == {"error": {"message": "Only one of regex, json_schema, or ebnf can be set."}}
    r = generate(engine_url, {"json_schema": SCHEMA})  # an object, not SGLang's JSON string
    assert r.status_code == 400 and "json_schema must be a string" in r.json()["error"]["message"]
    assert generate(engine_url, {"stop_regex": "x"}).status_code == 400  # still not implemented


async def test_batch_mixes_constrained_and_free_requests(padded_engine: Engine) -> None:
    """One decode batch, half constrained: the free half samples exactly what it samples alone."""
    prompt = padded_engine.tokenizer.encode("Tell me about yourself.")
    free = [
        {"temperature": 1.0, "max_new_tokens": 24, "ignore_eos": True, "sampling_seed": s} for s in range(4)
    ]
    constrained = [{"regex": REGEX, "temperature": 1.5, "sampling_seed": s} for s in range(4)]
    alone = await run_requests(padded_engine, prompt, free)
    params = [p for pair in zip(free, constrained, strict=True) for p in pair]
    grammars = [
        padded_engine.grammar_matcher(c) if (c := constraint_of(parse_sampling_params(p))) else None
        for p in params
    ]
    mixed = await run_requests(padded_engine, prompt, params, grammars=grammars)
    for i, req in enumerate(mixed):
        if i % 2:
            text = padded_engine.tokenizer.decode(req.output_ids[:-1])
            assert re.fullmatch(REGEX, text), text
            assert req.finish_reason == {"type": "stop", "matched": req.output_ids[-1]}
        else:
            assert req.output_ids == alone[i // 2].output_ids


@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_grammar_at_odds_with_min_new_tokens_fails_alone(
    padded_engine: Engine, temperature: float
) -> None:
    """`regex: "a"` allows only a stop token after "a", which min_new_tokens bans: that request ends
    with a 500 abort; the free request decoding beside it finishes normally."""
    prompt = padded_engine.tokenizer.encode("Hello")
    params = [
        {"regex": "a", "min_new_tokens": 3, "temperature": temperature},
        {"max_new_tokens": 8, "ignore_eos": True, "temperature": temperature},
    ]
    grammars = [padded_engine.grammar_matcher(Constraint("regex", "a")), None]
    bad, free = await run_requests(padded_engine, prompt, params, grammars=grammars)
    assert bad.finish_reason["type"] == "abort" and bad.finish_reason["status_code"] == 500
    assert "outside the request's grammar" in bad.finish_reason["message"]
    assert free.finish_reason == {"type": "length", "length": 8}
