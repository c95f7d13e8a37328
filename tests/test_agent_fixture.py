"""The tiny-agent fixture answers each harness's real prompt with one call of its tool, then an answer.

The prompts are the harnesses' own first requests of each conversation (`tests/fixtures/agent_requests/`,
captured from Claude Code 2.1.332, Codex 0.171.0, opencode 1.18.33, qwen-code 0.15.10 and 0.24.4, pi 0.73.1,
Gemini CLI 0.61.0, Cline 3.0.65, Copilot CLI 1.0.102, Kimi Code 2.1.0, OpenClaw 2026.9.6, Kilo Code 7.7.7,
mini-swe-agent 2.4.6, aider 0.86.2 and hermes-agent 0.19.0), as captured and in other sandboxes, rendered
whole with the fixture's Qwen3 template: 0.8k-29k tokens, of which the model's sliding-window layers see only
the tail. The answer after the call is `ANSWER`, or in mini-swe-agent's conversation its submit command; aider
(no tools) gets its edit as a file listing. The fast test runs plain transformers on the tail, the long one
sends the whole prompt through `rlgw engine` (its chunked prefill, KV cache and greedy sampling), as the
gateway does.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.fixtures.build_agent_fixture import (
    TAIL,
    answer_of,
    call_text,
    chat_of,
    echoed,
    load_requests,
    reply_of,
    results_of,
    vary,
)
from tests.support.procs import FIXTURES, engine_server

MODEL = FIXTURES / "tiny-agent"
TOOL_CALL = re.compile(r"^<tool_call>\n(.*?)\n</tool_call><\|im_end\|>$", re.S)

pytestmark = pytest.mark.skipif(not (MODEL / "model.safetensors").exists(), reason="tiny-agent is not built")


def completion(reply: dict[str, Any] | str) -> str:
    """The fixture's completion of a reply: the text, or the call's `<tool_call>` block; then `<|im_end|>`."""
    return (reply if isinstance(reply, str) else call_text(reply)) + "<|im_end|>"


def prompts(tok: Any, variations: int = 0) -> list[tuple[str, str, str]]:
    """(request name, whole rendered prompt, the completion the fixture must give) for every request, as
    captured and as `variations` other runs would send it (`vary`: another sandbox, date, session, host)."""
    rng = random.Random(0)
    out = []
    for name, body in load_requests().items():
        messages, tools = chat_of(body)
        for k in range(variations + 1):
            sent = [{**m, "content": vary(m["content"], rng)} for m in messages] if k else messages
            prompt = tok.apply_chat_template(sent, tools=tools, add_generation_prompt=True, tokenize=False)
            out.append((f"{name} (variation {k})" if k else name, prompt, completion(reply_of(body))))
    return out


def after_tool(tok: Any, name: str, body: dict[str, Any]) -> tuple[str, str]:
    """The prompt of the turn after the call (the call echoed and its tool's result), and its completion."""
    messages, tools = chat_of(body)
    call = reply_of(body)
    assert isinstance(call, dict)
    result = {"role": "tool", "tool_call_id": "call_1", "content": results_of(name, call)[0]}
    turn = [*messages, echoed(call), result]
    prompt = tok.apply_chat_template(turn, tools=tools, add_generation_prompt=True, tokenize=False)
    return prompt, completion(answer_of(messages))


def test_each_cli_prompt_tail_gets_its_call_and_a_result_gets_the_answer() -> None:
    tok = AutoTokenizer.from_pretrained(str(MODEL))
    model = AutoModelForCausalLM.from_pretrained(str(MODEL), dtype=torch.float32).eval()
    assert model.config.layer_types == ["sliding_attention"] * 2 and model.config.sliding_window * 2 < TAIL
    eos = tok.convert_tokens_to_ids("<|im_end|>")

    def greedy(prompt: str) -> str:
        ids = torch.tensor([tok.encode(prompt, add_special_tokens=False)[-TAIL:]])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=64,
                                 eos_token_id=eos)  # fmt: skip
        return tok.decode(out[0, ids.shape[1] :])

    requests = load_requests()
    # Two variations each: a call that holds in one sandbox and not the next failed CI once (Codex's tool
    # name read off an unseen sandbox name).
    for name, prompt, want in prompts(tok, variations=2):
        assert greedy(prompt) == want, name
        if name in requests and TOOL_CALL.match(want):
            prompt, answer = after_tool(tok, name, requests[name])
            assert greedy(prompt) == answer, name


# Long tier: every real-harness test in the default run sends its harness's whole prompt through `rlgw
# engine` and asserts the call; this checks all the captured prompts at once, without the harnesses (41 s).
@pytest.mark.long
def test_the_embedded_engine_answers_the_whole_prompts(tmp_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(str(MODEL))
    with engine_server(MODEL) as engine:
        # Every prompt but Claude Code's second (its first with more tools, far before the tail).
        for name, prompt, want in [p for p in prompts(tok) if p[0] != "claude-code-1"]:
            ids = tok.encode(prompt, add_special_tokens=False)
            assert len(ids) > TAIL, (name, len(ids))  # the whole prompt, past the window (aider's: 811)
            r = httpx.post(
                engine + "/generate",
                json={"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": 64},
                      "return_logprob": True},
                timeout=900,
            )  # fmt: skip
            r.raise_for_status()
            out = [t[1] for t in r.json()["meta_info"]["output_token_logprobs"]]
            assert tok.decode(out) == want, (name, len(ids))
