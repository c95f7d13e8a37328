"""The RL loop learns with the real SGLang serving: `rlgw train` (trainer/configs/word-tiny.json's task)
through the gateway in front of SGLang, GRPO, and after every iteration the new version (v0 full, then
xor deltas) pulled here and loaded into SGLang with `/update_weights_from_disk` (`sync/sglang_reload.py`).

SGLang stamps the version it serves on every response (`meta_info.weight_version`) and the samples
record it, so the rollouts of iteration i were sampled by v(i) exactly. SGLang ignores sampling seeds
on CPU (no `--enable-deterministic-inference`), so the run is not repeatable and the receipts say so.
The session's SGLang gets the fixture's weights back at the end.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from rlgw.trainer.loop import load_dump
from tests.support.e2e import Stack
from tests.support.procs import REPO
from tests.support.sglang_env import restore_weights

pytestmark = pytest.mark.slow
ITERATIONS = 16


def _versions_sampled(dump: Path, iterations: int) -> list[set[str]]:
    """Per iteration, the weight versions SGLang reported for the tokens of the samples trained on."""
    return [
        {
            span.version
            for t in load_dump(dump / f"iteration-{it:05d}.jsonl")
            for span in t.sample.weight_versions
        }
        for it in range(iterations)
    ]


def test_the_loop_learns_with_sglang_serving(sglang_qwen3: Stack, tmp_path: Path) -> None:
    model = Path(httpx.get(sglang_qwen3.engine + "/model_info").json()["model_path"])
    cfg = json.loads((REPO / "trainer" / "configs" / "word-tiny.json").read_text())
    cfg.update(model=str(model), gateway_url=sglang_qwen3.gateway, engine_urls=[sglang_qwen3.engine])
    cfg["sync"]["engine_kind"] = "sglang"
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "rlgw.bin.main", "--log-level", "warning", "train", "--config",
             str(tmp_path / "cfg.json"), "--work-dir", str(tmp_path / "work"), "--no-progress",
             "--iterations", str(ITERATIONS), "--seed", "0", "--dump-rollouts", str(tmp_path / "dump")],
            cwd=REPO, capture_output=True, text=True, timeout=1500,
        )  # fmt: skip
    finally:
        restore_weights(sglang_qwen3.engine, model)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    receipts = [json.loads(line) for line in (tmp_path / "work" / "receipts.jsonl").read_text().splitlines()]
    rewards = [r["reward_mean"] for r in receipts]
    print("reward per iteration with SGLang serving:", [round(x, 3) for x in rewards])
    print("IS ratio per iteration:", [round(r["losses"]["ratio_mean"], 5) for r in receipts])
    assert rewards[0] < 0.2, rewards
    assert sum(rewards[-2:]) / 2 > 0.8, rewards
    assert receipts[0]["served_at_start"] == ["0"]
    for i, r in enumerate(receipts):
        assert r["published"]["version"] == i + 1 and r["published"]["kind"] == "delta"
        assert r["published"]["served_versions"] == [str(i + 1)]  # SGLang reports the new version
        assert r["not_repeatable"]  # SGLang on CPU ignores sampling seeds, and the receipt says so
        assert r["losses"]["ratio_mean"] == pytest.approx(1.0, abs=1e-3)  # SGLang and trainer agree
    # Iteration i's rollouts were sampled by v(i) only: the load of v(i) came before them, and SGLang
    # stamped each token with the version it served.
    assert _versions_sampled(tmp_path / "dump", ITERATIONS) == [{str(i)} for i in range(ITERATIONS)]
