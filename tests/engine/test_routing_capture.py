"""The embedded engine reports routed experts as SGLang does: `return_routed_experts` on `/generate`,
`meta_info["routed_experts"]` base64 of int32 [seqlen - 1 - start, layers, top_k], and the ids equal
the top-k a plain Hugging Face forward's routers pick over the same tokens (a dense layer's rows 0).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from tests.support.moe_routing import decode_routed_experts, hf_routing
from tests.support.procs import engine_server
from tests.trainer.support import tiny_qwen3_moe

LAYERS, TOP_K = 2, 2


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory) -> Path:
    # Layer 1 dense: its rows must be zeros, as SGLang's capture buffer leaves them.
    return tiny_qwen3_moe(tmp_path_factory.mktemp("moe"), mlp_only_layers=(1,))


@pytest.fixture(scope="module")
def moe_url(moe_model: Path) -> Iterator[str]:
    with engine_server(moe_model) as url:
        yield url


def decode(meta: dict) -> np.ndarray:
    return decode_routed_experts(meta["routed_experts"], LAYERS, TOP_K)


def generate(url: str, body: dict) -> list[dict] | dict:
    r = httpx.post(f"{url}/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_routing_equals_hf_routers_topk(moe_url: str, moe_model: Path) -> None:
    # Two prompts of different lengths in one call: the decode batch is left-padded.
    prompts = [[11, 12, 13, 14, 15, 16, 17], [21, 22, 23]]
    params = {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True}
    outs = generate(moe_url, {"input_ids": prompts, "sampling_params": params, "return_routed_experts": True})
    for prompt, out in zip(prompts, outs, strict=True):
        seq = prompt + out["output_ids"]
        got = decode(out["meta_info"])
        assert got.shape == (len(seq) - 1, LAYERS, TOP_K)
        assert np.array_equal(got, hf_routing(moe_model, seq[:-1]))
        assert not got[:, 1].any() and got[:, 0].any()


def test_start_len_returns_the_tail_and_prefix_cache_keeps_it_exact(moe_url: str, moe_model: Path) -> None:
    prompt = [31, 32, 33, 34, 35, 36, 37, 38, 39]
    params = {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}
    first = generate(moe_url, {"input_ids": prompt, "sampling_params": params, "return_routed_experts": True})
    # The same prompt again: its prefix is cached, but positions from the start must be computed.
    body = {"input_ids": prompt, "sampling_params": params, "return_routed_experts": True}
    again = generate(moe_url, {**body, "routed_experts_start_len": 5})
    assert again["output_ids"] == first["output_ids"]
    assert np.array_equal(decode(again["meta_info"]), decode(first["meta_info"])[5:])


def test_bad_start_len_is_refused(moe_url: str) -> None:
    body = {"input_ids": [1, 2, 3], "return_routed_experts": True, "routed_experts_start_len": 4}
    r = httpx.post(f"{moe_url}/generate", json=body, timeout=30)
    assert r.status_code == 400
    assert "routed_experts_start_len" in r.text


def test_not_asked_not_returned(moe_url: str) -> None:
    out = generate(moe_url, {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2}})
    assert "routed_experts" not in out["meta_info"]


def test_rows_from_start_len_and_a_refed_position_replaces_its_row() -> None:
    from rlgw.engine.request import Request
    from rlgw.engine.routing import keep_rows, routed_rows, routing_floor
    from rlgw.engine.sampling import parse_sampling_params

    def rows(first: int, last: int, tag: int = 0) -> torch.Tensor:
        """Position p routes to (p + tag) in every slot: a row says which position it is."""
        p = torch.arange(first, last, dtype=torch.int32) + tag
        return p[:, None, None].expand(-1, LAYERS, TOP_K).clone()

    req = Request("r", [1] * 6, parse_sampling_params({}), sink=lambda _u: None)
    req.return_routed_experts, req.routed_experts_start_len = True, 2
    keep_rows(req, 0, rows(0, 6))  # a prefill from 0: positions before the start are dropped
    keep_rows(req, 6, rows(6, 7))  # a decode step
    assert routing_floor(req) == 7
    keep_rows(req, 4, rows(4, 7, tag=100))  # a retracted request's re-prefill from position 4
    got = routed_rows(req)[:, 0, 0].tolist()
    assert got == [2, 3, 104, 105, 106]
