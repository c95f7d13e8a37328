"""Routed experts recorded end to end through the real SGLang 0.5.23 (CPU, float32).

SGLang launched with `--enable-return-routed-experts` answers `return_routed_experts` on `/generate`
with `meta_info["routed_experts"]`: base64 of little-endian int32 [seqlen - 1 - start, layers, top_k]
(`routed_experts_start_len`, default 0). The same field and shape as the embedded engine's
(`tests/engine/test_routing_capture.py`), and on a MoE whose router margins are wide the ids equal a
plain HF forward's. Then `rlgw serve` in front of it records them: the stored sample's
`rollout_routed_experts` covers every token but the last, as HF routes them.

Needs the cached SGLang venv (`python -m tests.support.sglang_env`) and a CUDA device: SGLang 0.5.23
allocates the capture's host buffer pinned (`state_capturer/base.py` `BaseHostCache`: `pin_memory=True`
-> `cudaHostRegister`), so on a CPU-only torch `--enable-return-routed-experts` dies at start-up with
"Torch not compiled with CUDA enabled" (seen 2026-12-05 on this machine). Skipped where that module is
not on the branch, or without CUDA.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import torch

from rlgw.gateway.sample import routing_from_json
from tests.support.moe_routing import decode_routed_experts, hf_routing
from tests.support.procs import free_port, wait_healthy
from tests.trainer.support import tiny_qwen3_moe

sglang_env = pytest.importorskip("tests.support.sglang_env")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="SGLang 0.5.23's --enable-return-routed-experts pins its host buffer with cudaHostRegister: "
        "it needs a CUDA build of torch and a GPU",
    ),
]

LAYERS, TOP_K = 2, 2


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory) -> Path:
    return tiny_qwen3_moe(tmp_path_factory.mktemp("moe"))  # router x20: margins no rounding flips


@pytest.fixture(scope="module")
def sglang(moe_model: Path, tmp_path_factory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("sglang") / "server.log"
    with sglang_env.sglang_server(moe_model, "--enable-return-routed-experts", log=log) as url:
        yield url


def test_generate_returns_routing_as_hf_routes(sglang: str, moe_model: Path) -> None:
    prompt = [11, 12, 13, 14, 15, 16, 17, 18]
    body = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True},
        "return_routed_experts": True,
    }
    out = httpx.post(f"{sglang}/generate", json=body, timeout=120).json()
    seq = prompt + out["output_ids"]
    got = decode_routed_experts(out["meta_info"]["routed_experts"], LAYERS, TOP_K)
    assert got.shape == (len(seq) - 1, LAYERS, TOP_K)
    assert np.array_equal(np.sort(got, -1), np.sort(hf_routing(moe_model, seq[:-1]), -1))
    tail = httpx.post(f"{sglang}/generate", json={**body, "routed_experts_start_len": 5}, timeout=120).json()
    assert tail["output_ids"] == out["output_ids"]
    assert np.array_equal(decode_routed_experts(tail["meta_info"]["routed_experts"], LAYERS, TOP_K), got[5:])


def test_gateway_records_sglangs_routing(sglang: str, moe_model: Path, tmp_path: Path) -> None:
    port = free_port()
    args = ["serve", "--engine-url", sglang, "--port", str(port), "--data-dir", str(tmp_path)]
    with open(tmp_path / "gateway.log", "ab") as log:
        cmd = [sys.executable, "-m", "rlgw.bin.main", *args]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ)
    try:
        gw = f"http://127.0.0.1:{port}"
        wait_healthy(gw + "/health", proc)
        s = httpx.post(gw + "/v1/sessions", json={"task_id": "moe", "sampling_precedence": "request"}).json()
        client = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
        messages = [{"role": "user", "content": "Count."}]
        for k in range(2):
            msg = client.chat.completions.create(model="m", messages=messages, temperature=0.0, max_tokens=6)
            messages += [
                {"role": "assistant", "content": msg.choices[0].message.content or ""},
                {"role": "user", "content": f"and {k}?"},
            ]
        summary = httpx.post(gw + f"/v1/sessions/{s['session_id']}/finish", json={"reward": 1.0}).json()
        assert summary["rejects"] == [] and len(summary["samples"]) == 1
        doc = httpx.get(gw + f"/v1/trajectories/{summary['samples'][0]['cursor']}").json()
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    routed = routing_from_json(doc["rollout_routed_experts"])
    assert routed.shape == (len(doc["tokens"]) - 1, LAYERS, TOP_K)
    want = hf_routing(moe_model, doc["tokens"][:-1])
    assert np.array_equal(np.sort(routed, -1), np.sort(want, -1))
