"""The reasoning format: Qwen3's ``<think>...</think>`` (SGLang's ``qwen3`` reasoning parser).

What the format means (`SGLANG_PROTOCOL.md` §4): the text before ``</think>`` is
``reasoning_content`` (a leading ``<think>`` is stripped), the rest is ``content``. Reasoning is
*forced* when the prompt already opened the think block (Qwen3-Thinking templates, or
``qwen3-thinking``): then output without ``<think>`` still splits at ``</think>``. With no
``</think>`` everything is reasoning, unless a ``<tool_call>`` appears, which ends it. When not
forced, output that does not start with ``<think>`` is all content.

Where we deliberately differ from SGLang, so that streamed and non-streamed answers agree:
``<think>`` opens reasoning only at the start of the output (after whitespace); SGLang's one-shot
parse also accepts it later and counts the text before it as reasoning, its streaming parse does not.

This module owns the markers and the choice of mode; `output_parser` runs the state machine.
"""

from __future__ import annotations

THINK_START = "<think>"
THINK_END = "</think>"

# Reasoning parser names accepted on the command line -> forced (the prompt always opens <think>).
REASONING_PARSERS = {"qwen3": False, "qwen3-thinking": True}


def reasoning_forced_by_parser(name: str) -> bool:
    """Whether the named reasoning parser always forces reasoning; ValueError if unknown."""
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise ValueError(
            f"unknown reasoning parser {name!r}; expected one of {', '.join(REASONING_PARSERS)}"
        ) from None


def detect_reasoning(chat_template: str | None) -> bool:
    """Whether a chat template belongs to a model that thinks in ``<think>`` blocks."""
    return bool(chat_template) and THINK_START in chat_template


def prompt_forces_reasoning(prompt_text: str) -> bool:
    """Whether a rendered prompt ends inside an open think block (the model continues reasoning).

    True for Qwen3-Thinking generation prompts (``...<|im_start|>assistant\\n<think>\\n``); False for
    Qwen3 with ``enable_thinking=False``, whose prompt closes the block (``<think>\\n\\n</think>\\n\\n``).
    """
    return prompt_text.rstrip().endswith(THINK_START)
