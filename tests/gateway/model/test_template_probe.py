"""The start-up probe on real templates: what it finds, and that it catches templates it cannot follow."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from rlgw.gateway.model.render import ChatRenderer, TemplateConfig
from rlgw.gateway.model.template_probe import probe_template
from tests.support.real_tokenizers import chatml_tokenizer, qwen3_tokenizer


def test_qwen3_findings() -> None:
    report = probe_template(ChatRenderer(qwen3_tokenizer()))
    assert not report.append_only
    assert report.strips_history_reasoning
    assert report.groups_consecutive_tools
    assert report.increment_matches_full_render, report.notes
    assert report.turns == 6
    summary = report.summary().splitlines()
    assert "history <think> stripped by the template; the ledger keeps the sampled tokens" in summary
    assert any(line.startswith("consecutive tool messages grouped") for line in summary)
    assert "incremental rendering matches the template's full render on all 6 probe turns" in summary
    assert any("enable_thinking=False" in n and "<think>\\n\\n</think>" in n for n in report.notes)


def test_an_anchor_that_counts_as_a_user_query_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a real user query, Qwen3 keeps no reasoning; an increment rendered after a user
    anchor would keep an agent-supplied assistant's <think> block. The probe must see that."""
    renderer = ChatRenderer(qwen3_tokenizer())
    plain = ChatRenderer.render_continuation

    def fixed_anchor(self, new, tools, *, previous_ended_with_eos, anchor_user=None, **kw):
        return plain(
            self,
            new,
            tools,
            previous_ended_with_eos=previous_ended_with_eos,
            anchor_user={"role": "user", "content": "x"},
            **kw,
        )

    monkeypatch.setattr(ChatRenderer, "render_continuation", fixed_anchor)
    report = probe_template(renderer)
    assert not report.increment_matches_full_render
    assert any("without a real user query" in n for n in report.notes)


def test_increments_match_the_full_render_without_a_user_query() -> None:
    renderer = ChatRenderer(qwen3_tokenizer())
    tools = None
    sys = {"role": "system", "content": "Do the task."}
    gen = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    new = [
        {"role": "tool", "tool_call_id": "c1", "content": "r1"},
        {"role": "assistant", "reasoning_content": "secret plan", "content": "note"},
        {"role": "tool", "tool_call_id": "c1", "content": "r2"},
    ]
    full = renderer.render_text([sys, gen, *new], tools, add_generation_prompt=True)
    inc = renderer.render_continuation(new, tools, previous_ended_with_eos=True, anchor_user=None)
    assert "secret plan" not in full
    assert full.endswith(renderer.tokenizer.decode(inc))


def test_tiny_qwen3_fixture_findings(tiny_qwen3) -> None:
    if not (tiny_qwen3 / "tokenizer_config.json").is_file():
        pytest.skip("tests/fixtures/tiny-qwen3 is not built")
    report = probe_template(ChatRenderer(AutoTokenizer.from_pretrained(tiny_qwen3)))
    assert (report.append_only, report.strips_history_reasoning, report.groups_consecutive_tools) == (
        False,
        True,
        True,
    )
    assert report.increment_matches_full_render, report.notes


def test_qwen3_with_thinking_off_by_default() -> None:
    config = TemplateConfig(template_kwargs={"enable_thinking": False})
    report = probe_template(ChatRenderer(qwen3_tokenizer(), config))
    assert report.increment_matches_full_render, report.notes
    assert any("closes the reasoning block" in n for n in report.notes)


def test_chatml_findings() -> None:
    report = probe_template(ChatRenderer(chatml_tokenizer()))
    assert report.append_only
    assert not report.strips_history_reasoning
    assert not report.groups_consecutive_tools
    assert report.increment_matches_full_render, report.notes
    assert any("does not render reasoning_content" in n for n in report.notes)


def test_template_that_depends_on_history_fails_the_probe() -> None:
    # Numbering turns makes a message's text depend on the whole history, which the anchor
    # cannot stand in for: the probe must say increments do not match.
    numbered = (
        "{% for m in messages %}<|im_start|>{{ m.role }} #{{ loop.index }}\n"
        "{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant #{{ messages | length + 1 }}\n{% endif %}"
    )
    report = probe_template(ChatRenderer(qwen3_tokenizer(), TemplateConfig(chat_template=numbered)))
    assert report.append_only
    assert not report.increment_matches_full_render
    assert "INCREMENTAL RENDERING DOES NOT MATCH" in report.summary()
    assert any("differs from the full render" in n for n in report.notes)


def test_template_refusing_the_probe_conversation_is_reported() -> None:
    no_tools = (
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tool role') }}{% endif %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    report = probe_template(ChatRenderer(qwen3_tokenizer(), TemplateConfig(chat_template=no_tools)))
    assert not report.increment_matches_full_render
    assert "no tool role" in report.summary()
