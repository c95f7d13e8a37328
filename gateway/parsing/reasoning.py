"""The reasoning format: Qwen3's ``<think>...</think>`` (SGLang's ``qwen3`` reasoning parser).

What the format means (`docs/SGLANG_PROTOCOL.md` §4): the text before ``</think>`` is
``reasoning_content`` (a leading ``<think>`` is stripped), the rest is ``content``. Reasoning is
*forced* when the prompt already opened the think block (Qwen3-Thinking templates; the gateway
sees it in the prompt ids): then output without ``<think>`` still splits at ``</think>``. With no
``</think>`` everything is reasoning, unless a ``<tool_call>`` appears, which ends it. When not
forced, output that does not start with ``<think>`` is all content.

Where we deliberately differ from SGLang, so that streamed and non-streamed answers agree:
``<think>`` opens reasoning only at the start of the output (after whitespace); SGLang's one-shot
parse also accepts it later and counts the text before it as reasoning, its streaming parse does not.

This module owns the markers and template detection; `output_parser` runs the state machine.
"""

from __future__ import annotations

THINK_START = "<think>"
THINK_END = "</think>"


def detect_reasoning(chat_template: str | None) -> bool:
    """Whether a chat template belongs to a model that thinks in ``<think>`` blocks."""
    return bool(chat_template) and THINK_START in chat_template
