"""`rlgw train`'s `cache_mib` reaches the embedded engine it starts (issue 29 part 4): with 0 the engine's
prefix cache is off, so a prompt sent twice is prefilled twice (`cached_tokens` 0 both times)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from rlgw.trainer.config import TrainConfig
from rlgw.trainer.loop import _services
from tests.support.procs import REPO

PROMPT = list(range(100, 140))


async def _twice(cfg: TrainConfig, work: Path) -> tuple[dict, list[int]]:
    """The engine's prefix-cache stats and `cached_tokens` of the same prompt sent twice."""
    async with _services(cfg, work) as svc:
        (engine,) = svc.engine_urls
        body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, "temperature": 0.0}}
        async with httpx.AsyncClient(base_url=engine, timeout=60) as http:
            cached = []
            for _ in range(2):
                r = await http.post("/generate", json=body)
                r.raise_for_status()
                cached.append(r.json()["meta_info"]["cached_tokens"])
            info = (await http.get("/server_info")).json()
    return info["prefix_cache"], cached


@pytest.mark.slow  # starts `rlgw serve` with its engine: 24 s at load 3 on the shared 2-core box
def test_cache_mib_zero_reaches_the_engine(tmp_path: Path) -> None:
    doc = json.loads((REPO / "trainer" / "configs" / "word-tiny.json").read_text())
    doc["model"] = str(REPO / doc["model"])
    assert TrainConfig.model_validate(doc).cache_mib is None  # the shipped config keeps serve's default
    cfg = TrainConfig.model_validate({**doc, "cache_mib": 0})
    stats, cached = asyncio.run(_twice(cfg, tmp_path))
    assert cached == [0, 0]
    assert stats["max_bytes"] == 0 and stats["cached_tokens"] == 0
