"""The RL loop learns with vLLM serving: `rlgw train` (trainer/configs/word-tiny.json's task) through the
gateway in front of vLLM, GRPO, and after every iteration an xor delta reloaded into vLLM in place
(`sync/vllm_reload.py`).

vLLM's raw logprobs at temperature 1 are the trainer's own `log_softmax(logits)`, so the PPO ratio of
freshly sampled tokens is 1. Slow and skipped unless the vLLM venv is built
(`python -m tests.support.vllm_env`); the session's vLLM gets the fixture's weights back at the end.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from rlgw.sync.vllm_reload import reload_engine
from tests.support.e2e import Stack
from tests.support.procs import REPO

pytestmark = pytest.mark.slow
ITERATIONS = 16


async def _restore(url: str, model: Path) -> None:
    async with httpx.AsyncClient(timeout=300) as client:
        await reload_engine(client, url, model, "default")


def test_the_loop_learns_with_vllm_serving(vllm_qwen3: Stack, qwen3_hd64: Path, tmp_path: Path) -> None:
    model = qwen3_hd64
    cfg = json.loads((REPO / "trainer" / "configs" / "word-tiny.json").read_text())
    cfg.update(model=str(model), gateway_url=vllm_qwen3.gateway, engine_urls=[vllm_qwen3.engine])
    cfg["sync"]["engine_kind"] = "vllm"
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "rlgw.bin.main", "--log-level", "warning", "train", "--config",
             str(tmp_path / "cfg.json"), "--work-dir", str(tmp_path / "work"), "--no-progress",
             "--iterations", str(ITERATIONS), "--seed", "0"],
            cwd=REPO, capture_output=True, text=True, timeout=1500,
        )  # fmt: skip
    finally:
        asyncio.run(_restore(vllm_qwen3.engine, model))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    receipts = [json.loads(line) for line in (tmp_path / "work" / "receipts.jsonl").read_text().splitlines()]
    rewards = [r["reward_mean"] for r in receipts]
    print("reward per iteration with vLLM serving:", [round(x, 3) for x in rewards])
    assert rewards[0] < 0.2, rewards
    assert sum(rewards[-2:]) / 2 > 0.8, rewards
    for i, r in enumerate(receipts):
        assert r["published"]["version"] == i + 1 and r["published"]["kind"] == "delta"
        assert r["published"]["served_versions"] == [str(i + 1)]  # vLLM reports the new version
        assert r["losses"]["ratio_mean"] == pytest.approx(1.0, abs=1e-3)  # vLLM and trainer agree
