"""Samples for the viewer tests, built the way the ledger builds them: real template text, real tokens.

A tool conversation is rendered piece by piece with the tokenizer's own ChatML markup (what the gateway's
renderer appends as mask-0 increments) and the assistant turns are tokenized as the model would have
sampled them (mask 1, negative logprobs), so the viewer sees sampled, tool, prompt and template tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlgw.gateway.sample import Sample, SampleStatus, VersionSpan, validate_sample

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
TOOL_RESULT = (
    '\n<|im_start|>user\n<tool_response>\n{"temperature": 21, "sky": "clear"}\n</tool_response><|im_end|>\n'
    "<|im_start|>assistant\n"
)
ANSWER = "It is 21 degrees and clear in Paris.<|im_end|>"


def tool_conversation(
    tokenizer: Any, rng: np.random.Generator, *, repeats: int = 1, metadata: dict | None = None
) -> Sample:
    """system + user prompt, then `repeats` x (tool call, tool result), then an answer."""
    prompt = (
        "<|im_start|>system\nYou are a weather assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    )
    pieces: list[tuple[str, int]] = []
    for _ in range(repeats):
        pieces += [(CALL, 1), (TOOL_RESULT, 0)]
    pieces.append((ANSWER, 1))
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    mask: list[int] = []
    for text, m in pieces:
        piece = tokenizer.encode(text, add_special_tokens=False)
        ids += piece
        mask += [m] * len(piece)
    n = len(mask)
    loss_mask = np.asarray(mask, np.uint8)
    logprobs = np.where(loss_mask == 1, -rng.exponential(0.6, n), 0.0).astype(np.float32)
    turns = repeats + 1
    sample = Sample(
        tokens=np.asarray(ids, np.int32),
        response_length=n,
        loss_mask=loss_mask,
        rollout_log_probs=logprobs,
        reward=1.0,
        status=SampleStatus.COMPLETED,
        rollout_id="r-weather",
        group_index=0,
        weight_versions=[VersionSpan("v1", 0, n)],
        metadata={
            "termination_reason": "agent_done",
            "segment": 0,
            "segment_cause": "start",
            "segments": 1,
            "turn_finish": ["tool_calls"] * repeats + ["stop"],
            "engine_rids": [f"rid-{i}" for i in range(turns)],
            **(metadata or {}),
        },
    )
    validate_sample(sample)
    return sample
