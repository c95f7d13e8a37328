"""Routed experts recorded end to end through the gateway: a MoE model on the embedded engine, a
multi-turn chat with the real `openai` client, a gateway restart mid-session (the journal keeps the
routing), and the stored sample's `rollout_routed_experts` equal to what a plain HF forward routes
over its tokens (all but the last: prompt, tool and template tokens included). Also the Parquet
export and the SDK-free ledger path: a turn the engine sent no routing for drops the segment's.
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
import pyarrow.parquet as pq
import pytest

from rlgw.gateway.sample import routing_from_json
from tests.support.gateway_proc import gateway_on_port
from tests.support.moe_routing import hf_routing
from tests.support.procs import engine_server, free_port
from tests.trainer.support import tiny_qwen3_moe


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory) -> Path:
    return tiny_qwen3_moe(tmp_path_factory.mktemp("moe"), mlp_only_layers=(1,))


@pytest.fixture(scope="module")
def engine(moe_model: Path) -> Iterator[str]:
    with engine_server(moe_model) as url:
        yield url


def chat(client: openai.OpenAI, messages: list[dict]) -> None:
    msg = client.chat.completions.create(model="m", messages=messages, temperature=0.0, max_tokens=6)
    messages.append({"role": "assistant", "content": msg.choices[0].message.content or ""})
    messages.append({"role": "user", "content": f"and then {len(messages)}?"})


def test_routing_survives_a_restart_into_the_store_and_parquet(
    engine: str, moe_model: Path, tmp_path: Path
) -> None:
    port = free_port()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count."}]
    gw = f"http://127.0.0.1:{port}"
    with gateway_on_port(engine, tmp_path, port):
        s = httpx.post(gw + "/v1/sessions", json={"task_id": "moe", "sampling_precedence": "request"}).json()
        client = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
        chat(client, messages)
        chat(client, messages)
    with gateway_on_port(engine, tmp_path, port):  # the session comes back from the journal
        chat(client, messages)
        summary = httpx.post(gw + f"/v1/sessions/{s['session_id']}/finish", json={"reward": 1.0}).json()
        assert summary["rejects"] == [] and len(summary["samples"]) == 1
        doc = httpx.get(gw + f"/v1/trajectories/{summary['samples'][0]['cursor']}").json()
    tokens = doc["tokens"]
    routed = routing_from_json(doc["rollout_routed_experts"])
    assert routed.shape == (len(tokens) - 1, 2, 2)
    assert np.array_equal(routed, hf_routing(moe_model, tokens[:-1]))

    out = tmp_path / "batch.parquet"
    cmd = [sys.executable, "-m", "rlgw.bin.main", "trajectories", "export", "--format", "parquet"]
    subprocess.run([*cmd, "--out", str(out), "--data-dir", str(tmp_path)], check=True, env=os.environ)
    row = pq.read_table(out).to_pylist()[0]
    assert np.array_equal(np.asarray(row["rollout_routed_experts"]).reshape(-1, 2, 2), routed)
