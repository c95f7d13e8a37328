"""The vLLM reload sequence (`sync/vllm_reload.py`) and its refusals, against scripted replies in the
shapes of vLLM 0.32.0's RL routes; the real server runs in `tests/vllm/test_vllm_weights.py`."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from rlgw.sync.errors import FleetMismatch, WeightSyncError
from rlgw.sync.vllm_reload import reload_engine


def _vllm(served: str, *, dev_mode: bool = True) -> tuple[httpx.AsyncClient, list[str]]:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(f"{request.method} {request.url.path}")
        if not dev_mode:
            return httpx.Response(404, json={"detail": "Not Found"})
        if request.url.path == "/reset_prefix_cache":
            return httpx.Response(200, json={"success": True})
        if request.url.path == "/weight_info":
            return httpx.Response(200, json={"weight_version": served})
        return httpx.Response(200, json={})

    return httpx.AsyncClient(transport=httpx.MockTransport(handler)), calls


async def test_a_reload_pauses_loads_labels_resets_and_resumes() -> None:
    client, calls = _vllm("3")
    await reload_engine(client, "http://vllm", Path("/ckpt/weight_v000003"), "3")
    assert calls == [
        "POST /pause",
        "POST /collective_rpc",
        "POST /update_weight_version",
        "POST /reset_prefix_cache",
        "POST /resume",
        "GET /weight_info",
    ]


async def test_an_engine_on_another_version_fails_the_sync() -> None:
    client, _ = _vllm("2")
    with pytest.raises(FleetMismatch, match="serves weight version '2' after loading v3"):
        await reload_engine(client, "http://vllm", Path("/ckpt"), "3")


async def test_a_server_without_dev_routes_is_named() -> None:
    client, _ = _vllm("3", dev_mode=False)
    with pytest.raises(WeightSyncError, match="VLLM_SERVER_DEV_MODE=1"):
        await reload_engine(client, "http://vllm", Path("/ckpt"), "3")


async def test_a_tied_lm_head_is_refused_before_any_engine_is_touched(
    tiny_qwen3: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    from rlgw.sync.publisher import WeightPublisher
    from rlgw.sync.vllm_reload import apply_version

    pub = WeightPublisher(tmp_path / "pub", aux_src=tiny_qwen3, durable=False)
    pub.publish(load_file(str(tiny_qwen3 / "model.safetensors")).items(), 1, "full")
    with pytest.raises(WeightSyncError, match="ties the LM head"):
        await apply_version(["http://127.0.0.1:9"], pub.root, 1, None, durable=False)
