"""The gateway's fidelity scenarios with vLLM as the engine (`tests/gateway/test_scenarios.py`'s table).

Each stored sample passes the three token-exactness checks (`tests/support/e2e.py`) against vLLM
itself: mask-1 tokens are vLLM's sampled ids and logprobs for each request id, fed exactly the
series before them; mask-0 tokens are the template's render; recorded logprobs equal vLLM's
teacher-forced prompt logprobs of the final series. Slow (vLLM starts in minutes on CPU) and
skipped unless the vLLM venv is built (`python -m tests.support.vllm_env`).
"""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import openai
import pytest

from tests.gateway.test_scenarios import QWEN3, Agent, Scenario
from tests.support import fixture_prompts as fp
from tests.support.e2e import Stack, finish, open_session, run_agent, stored

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("scenario", "kw", "stream"), QWEN3, ids=lambda v: getattr(v, "__name__", None))
def test_scenarios_on_vllm_are_token_exact(
    vllm_qwen3: Stack, scenario: Scenario, kw: dict[str, Any], stream: bool
) -> None:
    s = open_session(vllm_qwen3, task_id=scenario.__name__)
    agent = Agent(vllm_qwen3, s, tools=fp.TOOLS, kw=kw, stream=stream)
    agent.check(scenario(agent))


def test_samples_record_vllms_logprob_semantics(vllm_qwen3: Stack) -> None:
    s = open_session(vllm_qwen3, task_id="semantics")
    run_agent(vllm_qwen3, s, list(fp.WEATHER), followups=[], temperature=0.7, seed=3)
    doc = stored(vllm_qwen3, finish(vllm_qwen3, s["session_id"])["samples"][0]["cursor"])
    engine = doc["metadata"]["engine"]
    assert engine["kind"] == "vllm" and engine["version"] == "0.32.0"
    assert engine["logprobs_mode"] == "raw_logprobs" and engine["logprobs_mode_reported"]
    # Raw: the sampled tokens' logprobs are the unscaled log_softmax, whatever the temperature.
    tokens, n = doc["tokens"], doc["response_length"]
    mask = np.asarray(doc["loss_mask"], dtype=bool)
    p = len(tokens) - n
    forced = vllm_qwen3.forced_logprobs(vllm_qwen3.engine, tokens)
    np.testing.assert_allclose(
        np.asarray(doc["rollout_log_probs"])[mask], np.asarray(forced[p:], dtype=float)[mask], atol=1e-4
    )


def test_an_sdk_loop_streams_and_records(vllm_qwen3: Stack) -> None:
    s = open_session(vllm_qwen3, task_id="sdk")
    client = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
    chunks = client.chat.completions.create(
        model="m",
        messages=fp.PLAIN,
        stream=True,
        temperature=0.0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The capital of France is Paris."
    summary = finish(vllm_qwen3, s["session_id"])
    assert summary["rejects"] == [] and summary["trainable_tokens"] > 0


def test_a_refused_sampling_key_is_a_400(vllm_qwen3: Stack) -> None:
    s = open_session(vllm_qwen3, task_id="bad")
    r = httpx.post(
        s["base_url"] + "/chat/completions",
        headers={"Authorization": f"Bearer {s['api_key']}"},
        json={"model": "m", "messages": fp.PLAIN, "top_p": 0.0},
    )
    assert r.status_code == 400
    assert "top_p" in r.json()["error"]["message"]
