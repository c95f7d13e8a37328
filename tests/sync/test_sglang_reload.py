"""The SGLang load sequence (`sync/sglang_reload.py`) and its refusals, against scripted replies in the
shapes of SGLang 0.5.23's routes; the real server runs in `tests/sglang/test_sglang_weights.py` and
`tests/sglang/test_sglang_learns.py`."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from rlgw.sync.errors import FleetMismatch, TransferError
from rlgw.sync.sglang_reload import load_into_engine


def _sglang(served: str, *, success: bool = True) -> tuple[httpx.AsyncClient, list[tuple]]:
    calls: list[tuple] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append((request.method, request.url.path, json.loads(request.content or b"null")))
        if request.url.path == "/update_weights_from_disk":
            doc = {"success": success, "message": "" if success else "Failed to load: no such file",
                   "num_paused_requests": 0}  # fmt: skip
            return httpx.Response(200 if success else 400, json=doc)
        if request.url.path == "/model_info":
            return httpx.Response(200, json={"model_path": "/ckpt", "weight_version": served})
        return httpx.Response(404, json={"detail": "Not Found"})

    return httpx.AsyncClient(transport=httpx.MockTransport(handler)), calls


async def test_a_load_names_the_path_and_version_then_checks_the_served_one() -> None:
    client, calls = _sglang("3")
    await load_into_engine(client, "http://sglang", Path("/ckpt/weight_v000003"), "3")
    assert calls == [
        ("POST", "/update_weights_from_disk", {"model_path": "/ckpt/weight_v000003", "weight_version": "3"}),
        ("GET", "/model_info", None),
    ]


async def test_an_engine_on_another_version_fails_the_sync() -> None:
    client, _ = _sglang("2")
    with pytest.raises(FleetMismatch, match="serves weight version '2' after loading v3"):
        await load_into_engine(client, "http://sglang", Path("/ckpt"), "3")


async def test_a_failed_load_is_reported_with_sglangs_message() -> None:
    client, calls = _sglang("2", success=False)
    with pytest.raises(TransferError, match=r"answered 400.*no such file"):
        await load_into_engine(client, "http://sglang", Path("/ckpt"), "3")
    assert len(calls) == 1  # nothing asked of an engine whose load failed
