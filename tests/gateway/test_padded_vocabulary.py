"""Ids are bounded by the model's padded vocabulary (`config.vocab_size`), not the tokenizer's length.

tiny-qwen3's tokenizer has 4026 ids and its model 4096 rows. SGLang and vLLM sample the padded ids
4026..4095 (they normalize over all 4096, and so do the trainers): a sample holding one is what the
model did and is kept; an id past 4095 is still refused (a 400 on a prompt, `bad_token` at finish).
The gateway runs for real over HTTP in this process's threads, in front of the instant stub engine
(`bench/stub_engine.py`: SGLang's protocol, the fixture's tokenizer and `/model_info`).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench.stub_engine import build_app as build_stub_engine
from rlgw.gateway.app import GatewayConfig, create_app
from rlgw.gateway.model.profile import build_profile
from rlgw.gateway.viewer.data import decode_each
from tests.support.procs import serve_in_thread

TENANT_KEY = "padded-tenant-key-0123456789"
HEADERS = {"Authorization": f"Bearer {TENANT_KEY}"}
TOKENIZER_IDS, MODEL_IDS = 4026, 4096  # tiny-qwen3's tokenizer length and config.vocab_size


@pytest.fixture(scope="module")
def gw(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = GatewayConfig(
        engine_url="",
        data_dir=tmp_path_factory.mktemp("padded"),
        tenant_keys={TENANT_KEY: "t"},
        engine_wait=30,
    )
    with serve_in_thread(build_stub_engine(str(tiny_qwen3), 2048)) as engine_url:
        config.engine_url = engine_url
        with serve_in_thread(create_app(config)) as url:
            yield url


def _completion(gw: str, prompt: list[int]) -> tuple[str, httpx.Response]:
    s = httpx.post(gw + "/v1/sessions", json={"task_id": "padded"}, headers=HEADERS).json()
    r = httpx.post(
        s["base_url"] + "/completions",
        json={"prompt": prompt, "max_tokens": 4},
        headers={"Authorization": f"Bearer {s['api_key']}"},
    )
    return s["session_id"], r


def test_padded_ids_are_kept_through_finish(gw: str) -> None:
    sid, r = _completion(gw, [1, 2, TOKENIZER_IDS, MODEL_IDS - 1])
    assert r.status_code == 200, r.text
    done = httpx.post(gw + f"/v1/sessions/{sid}/finish", json={"reward": 1.0}, headers=HEADERS)
    assert done.status_code == 200, done.text
    assert len(done.json()["samples"]) == 1 and not done.json()["rejects"], done.json()


def test_an_id_past_the_models_vocabulary_is_refused(gw: str) -> None:
    _, r = _completion(gw, [1, 2, MODEL_IDS])
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "prompt" and f"[0, {MODEL_IDS})" in error["message"]


def test_the_bound_is_the_configs_else_the_tokenizers(tiny_qwen3: Path, tmp_path: Path) -> None:
    info = {"model_path": str(tiny_qwen3), "tokenizer_path": str(tiny_qwen3), "max_context_length": 2048}
    assert build_profile(info).vocab_size == MODEL_IDS
    tokenizer_only = tmp_path / "tokenizer"  # no config.json
    tokenizer_only.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(tiny_qwen3 / name, tokenizer_only / name)
    info = {"tokenizer_path": str(tokenizer_only), "max_context_length": 2048}
    assert build_profile(info).vocab_size == TOKENIZER_IDS


def test_the_viewer_decodes_a_padded_id_to_nothing(tiny_qwen3: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    assert decode_each(tok, np.asarray([40, TOKENIZER_IDS, MODEL_IDS - 1])) == [tok.decode([40]), "", ""]
