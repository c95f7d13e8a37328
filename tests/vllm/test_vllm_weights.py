"""Weight sync on vLLM (`sync/vllm_reload.py`): published versions, full then delta, pulled to a
host-local dir and reloaded in place; the gateway's samples say which version sampled each token.

Slow and skipped unless the vLLM venv is built (`python -m tests.support.vllm_env`). It ends on the
fixture's own weights again (v2), so the session's vLLM stack serves the other tests unchanged.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from safetensors.torch import load_file

from rlgw.sync.publisher import WeightPublisher
from rlgw.sync.vllm_reload import apply_version
from tests.support import fixture_prompts as fp
from tests.support.e2e import Stack, finish, open_session, stored

pytestmark = pytest.mark.slow


def _answer(st: Stack) -> dict:
    s = open_session(st, task_id="weights")
    client = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
    reply = client.chat.completions.create(
        model="m",
        messages=fp.PLAIN,
        temperature=0.0,
        max_tokens=8,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    doc = stored(st, finish(st, s["session_id"])["samples"][0]["cursor"])
    return {"text": reply.choices[0].message.content, "sample": doc}


def test_full_then_delta_versions_reload_in_place(
    vllm_qwen3: Stack, qwen3_hd64: Path, tmp_path: Path
) -> None:
    model = qwen3_hd64
    weights = load_file(str(model / "model.safetensors"))
    pub = WeightPublisher(tmp_path / "pub", aux_src=model, durable=False)
    local = tmp_path / "engine-local"

    # v1: the final norm zeroed, so every logit is 0 and every token has logprob -log(vocab).
    pub.publish(((k, v.mul(0) if k == "model.norm.weight" else v) for k, v in weights.items()), 1, "full")
    asyncio.run(apply_version([vllm_qwen3.engine], pub.root, 1, local, durable=False))
    flat = _answer(vllm_qwen3)["sample"]
    mask = np.asarray(flat["loss_mask"], dtype=bool)
    np.testing.assert_allclose(np.asarray(flat["rollout_log_probs"])[mask], -math.log(4096), atol=1e-4)
    assert {s["version"] for s in flat["weight_versions"]} == {"1"}

    # v2: the fixture's weights again, as an xor delta on v1.
    pub.publish(weights.items(), 2, "delta")
    result = asyncio.run(apply_version([vllm_qwen3.engine], pub.root, 2, local, durable=False))
    assert result.chain == [2]  # v1 was local already: only the delta was applied
    back = _answer(vllm_qwen3)
    assert back["text"] == "The capital of France is Paris."
    assert {s["version"] for s in back["sample"]["weight_versions"]} == {"2"}
    assert httpx.get(vllm_qwen3.engine + "/weight_info").json() == {"weight_version": "2"}
