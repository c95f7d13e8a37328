"""End to end: the real `openai` client -> `rlgw serve` -> recording proxy -> `rlgw engine`.

Multi-turn tool-using conversations on the two committed models (Qwen3's real template, and
SmolLM2's ChatML), checked token for token against what the engine returned:
- every mask-1 token is an engine output id, in order, for the rid that produced it;
- mask-0 tokens are exactly the template's rendering of the non-generated parts;
- the recorded logprobs equal the engine's teacher-forced logprobs of the final series;
- an agent that re-serializes tool-call arguments and drops reasoning causes no fork;
- streamed and non-streamed runs record the same thing for the same seed;
- eval mode stores nothing.
"""

from __future__ import annotations

import httpx
import numpy as np
import openai

from tests.support import fixture_prompts as fp
from tests.support.e2e import (
    Stack,
    check_sample,
    finish,
    mask_runs,
    open_session,
    run_agent,
    stored,
)


def test_qwen3_parallel_tool_loop_is_token_exact(qwen3: Stack) -> None:
    kw = {"enable_thinking": False}
    s = open_session(qwen3, task_id="weather")
    run = run_agent(
        qwen3,
        s,
        fp.TWO_CITIES,
        followups=["What is the weather in Berlin?"],
        extra_body={"chat_template_kwargs": kw},
    )
    assert len(run.replies[0].tool_calls) == 2, "the fixture answers the two-city prompt with parallel calls"
    summary = finish(qwen3, s["session_id"])
    assert summary["segments"] == 1 and summary["rejects"] == []
    doc = stored(qwen3, summary["samples"][0]["cursor"])
    check_sample(qwen3, doc, run, fp.TOOLS, kw)
    assert doc["reward"] == 1.0 and doc["status"] == "completed"


def test_qwen3_thinking_dropped_by_agent_and_template_causes_no_fork(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="think")
    run = run_agent(qwen3, s, fp.WEATHER, followups=["What is the weather in Berlin?"], drop_reasoning=True)
    assert any(r.reasoning_content for r in run.replies), "thinking is on: the fixture reasons first"
    summary = finish(qwen3, s["session_id"])
    assert summary["segments"] == 1 and summary["rejects"] == []
    doc = stored(qwen3, summary["samples"][0]["cursor"])
    # The ledger keeps the sampled <think> blocks that a re-render would have stripped.
    assert "<think>" in qwen3.tokenizer.decode(doc["tokens"][-doc["response_length"] :])
    check_sample(qwen3, doc, run, fp.TOOLS, {})


def test_chatml_tool_loop_is_token_exact(chatml: Stack) -> None:
    s = open_session(chatml, task_id="chatml")
    run = run_agent(
        chatml, s, fp.CHATML_TWO_CITIES, followups=["What is the weather in Berlin?"], tools=fp.TOOLS
    )
    assert len(run.replies[0].tool_calls) == 2
    summary = finish(chatml, s["session_id"])
    assert summary["segments"] == 1 and summary["rejects"] == []
    check_sample(chatml, stored(chatml, summary["samples"][0]["cursor"]), run, None, {})


def test_streamed_and_plain_runs_record_the_same_for_a_seed(qwen3: Stack) -> None:
    docs = []
    for stream in (False, True):
        s = open_session(qwen3, task_id=f"seed-{stream}")
        run_agent(qwen3, s, fp.WEATHER, followups=[], stream=stream, temperature=1.0, seed=1234)
        summary = finish(qwen3, s["session_id"])
        docs.append(stored(qwen3, summary["samples"][0]["cursor"]))
    a, b = docs
    for key in ("tokens", "loss_mask", "response_length"):
        assert a[key] == b[key], key
    # The second run reuses the first's prompt KV from the engine's prefix cache: its logprobs agree
    # to 1e-5 (the cache's guarantee), not bit for bit.
    np.testing.assert_allclose(a["rollout_log_probs"], b["rollout_log_probs"], rtol=0, atol=1e-5)


def test_eval_mode_serves_and_stores_nothing(qwen3: Stack) -> None:
    before = httpx.get(qwen3.gateway + "/v1/trajectories?limit=1000").text.count("\n")
    s = open_session(qwen3, task_id="eval", mode="eval")
    run = run_agent(qwen3, s, fp.WEATHER, followups=[])
    assert run.replies and run.replies[0].tool_calls
    summary = finish(qwen3, s["session_id"])
    assert summary["samples"] == [] and summary["segments"] == 0
    assert httpx.get(qwen3.gateway + "/v1/trajectories?limit=1000").text.count("\n") == before


def test_stop_string_is_trimmed_for_the_agent_but_kept_in_the_ledger(qwen3: Stack) -> None:
    kw = {"enable_thinking": False}
    s = open_session(qwen3, task_id="stop")
    client = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
    extra = {"chat_template_kwargs": kw}
    first = client.chat.completions.create(
        model="m", messages=fp.PLAIN, temperature=0, stop=["Paris"], extra_body=extra
    ).choices[0]
    assert first.finish_reason == "stop" and "Paris" not in first.message.content
    history = [*fp.PLAIN, {"role": "assistant", "content": first.message.content}, *fp.WEATHER]
    client.chat.completions.create(model="m", messages=history, temperature=0, extra_body=extra)
    summary = finish(qwen3, s["session_id"])
    doc = stored(qwen3, summary["samples"][0]["cursor"])
    tok = qwen3.tokenizer
    runs = mask_runs(np.asarray(doc["loss_mask"]))
    p = len(doc["tokens"]) - doc["response_length"]
    end = p + runs[0][1]
    assert "Paris" in tok.decode(doc["tokens"][p:end])  # the sampled stop text is in the sample
    assert tok.decode(doc["tokens"][end : end + 1]) == "<|im_end|>"  # and the template closes the turn
