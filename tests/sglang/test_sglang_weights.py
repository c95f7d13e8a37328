"""Weight sync into the real SGLang: rlgw publishes a full version and an xor delta, pulls each to a
host-local directory (`rlgw.sync.pull`), and SGLang loads it with `/update_weights_from_disk`; the
version SGLang then reports in `meta_info` is the one the gateway's samples record.

It ends on the fixture's own weights again (v2), so the session's SGLang serves the other tests unchanged.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import openai
from safetensors.torch import load_file

from rlgw.sync.publisher import WeightPublisher
from rlgw.sync.pull import pull
from tests.support import fixture_prompts as fp
from tests.support.e2e import Stack, finish, open_session, stored
from tests.support.procs import REPO
from tests.support.sglang_env import restore_weights


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


def _load(st: Stack, path: Path, version: int) -> dict:
    r = httpx.post(
        st.engine + "/update_weights_from_disk",
        json={"model_path": str(path), "weight_version": str(version)},
        timeout=120,
    )
    r.raise_for_status()
    return r.json()


def _engine_version(st: Stack) -> str:
    r = httpx.post(
        st.engine + "/generate",
        json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}},
        timeout=60,
    )
    return r.json()["meta_info"]["weight_version"]


def test_a_full_then_an_xor_delta_version_load_from_disk(sglang_qwen3: Stack, tmp_path: Path) -> None:
    model = Path(httpx.get(sglang_qwen3.engine + "/model_info").json()["model_path"])
    weights = load_file(str(model / "model.safetensors"))
    pub = WeightPublisher(tmp_path / "pub", aux_src=model, durable=False)
    local = tmp_path / "engine-local"

    # v1: the final norm zeroed, so every logit is 0 and every token has logprob -log(4096): SGLang
    # normalizes over the model's whole (padded) vocabulary.
    pub.publish(((k, v.mul(0) if k == "model.norm.weight" else v) for k, v in weights.items()), 1, "full")
    first = pull(pub.root, 1, local, durable=False)
    assert _load(sglang_qwen3, first.path, 1)["success"]
    assert _engine_version(sglang_qwen3) == "1"
    flat = _answer(sglang_qwen3)["sample"]
    mask = np.asarray(flat["loss_mask"], dtype=bool)
    np.testing.assert_allclose(np.asarray(flat["rollout_log_probs"])[mask], -math.log(4096), atol=1e-4)
    assert {s["version"] for s in flat["weight_versions"]} == {"1"}

    # v2: the fixture's weights again, as an xor delta on v1.
    pub.publish(weights.items(), 2, "delta")
    second = pull(pub.root, 2, local, durable=False)
    assert second.chain == [2]  # v1 was local already: only the delta was applied
    assert _load(sglang_qwen3, second.path, 2)["success"]
    back = _answer(sglang_qwen3)
    assert back["text"] == "The capital of France is Paris."
    assert {s["version"] for s in back["sample"]["weight_versions"]} == {"2"}
    assert _engine_version(sglang_qwen3) == "2"


def test_rlgw_sync_apply_loads_a_version_into_sglang(sglang_qwen3: Stack, tmp_path: Path) -> None:
    # `rlgw sync apply --engine-kind sglang`: pulled here, loaded with /update_weights_from_disk, and the
    # version SGLang reports afterwards checked. The fixture's own weights, so the answer stays the same.
    model = Path(httpx.get(sglang_qwen3.engine + "/model_info").json()["model_path"])
    pub = WeightPublisher(tmp_path / "pub", aux_src=model, durable=False)
    pub.publish(load_file(str(model / "model.safetensors")).items(), 7, "full")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "rlgw.bin.main", "sync", "apply", "--root", str(pub.root), "--version",
             "7", "--local-dir", str(tmp_path / "local"), "--engine", sglang_qwen3.engine,
             "--engine-kind", "sglang"],
            cwd=REPO, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert "1 sglang engine(s) serve v7" in done.stdout
        assert (
            httpx.get(sglang_qwen3.engine + "/model_info")
            .json()["model_path"]
            .startswith(str(tmp_path / "local"))
        )
        assert _engine_version(sglang_qwen3) == "7"
        back = _answer(sglang_qwen3)
        assert back["text"] == "The capital of France is Paris."
        assert {s["version"] for s in back["sample"]["weight_versions"]} == {"7"}
    finally:
        restore_weights(sglang_qwen3.engine, model)
