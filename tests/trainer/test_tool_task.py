"""The built-in tool task (trainer/configs/tool-tiny.json): its verifier, and (slow) its sessions train.

The run is a real `rlgw train` process on the tiny Qwen3 fixture after the task's format warm start
(`warm_start`, once per module): two-turn gateway sessions with `tools=[locate]`, the tool's result sent
back as a `tool` message (mask 0), the trainer's logprobs equal to the engine's on every token.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlgw.trainer.tool_task import tool_reward, warm_start
from tests.support.procs import FIXTURES, REPO

CONFIG = REPO / "trainer" / "configs" / "tool-tiny.json"


def test_the_verifier_pays_a_call_and_the_results_city_only() -> None:
    assert tool_reward(True, "Cairo", "Cairo") == 1.0
    assert tool_reward(True, " Cairo.", "Cairo") == 1.0
    assert tool_reward(True, "Dublin", "Cairo") == 0.0
    assert tool_reward(False, "Cairo", "Cairo") == 0.0  # right by chance, without calling the tool
    assert tool_reward(True, None, "Cairo") == 0.0


def _tool_output_masked(dump: Path) -> bool:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(FIXTURES / "tiny-qwen3")
    start, end = tok.convert_tokens_to_ids(["<tool_response>", "</tool_response>"])
    seen = False
    for line in dump.read_text().splitlines():
        doc = json.loads(line)
        n = doc["response_length"]
        response, mask = np.asarray(doc["tokens"][-n:]), np.asarray(doc["loss_mask"])
        if start in response:
            a, b = int(np.argmax(response == start)), int(np.argmax(response == end))
            assert mask[a : b + 1].sum() == 0 and mask[:a].sum() > 0 and mask[b + 1 :].sum() > 0
            seen = True
    return seen


@pytest.fixture(scope="module")
def warm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return warm_start(FIXTURES / "tiny-qwen3", tmp_path_factory.mktemp("tool") / "model")


@pytest.mark.slow
def test_tool_sessions_train_with_the_tool_output_masked(warm_model: Path, tmp_path: Path) -> None:
    """Two iterations: the warm-started model calls the tool, its result is mask 0, logprobs agree.

    That the reward then rises above 0.8 is NOT shown: on this fixture it rose only to 0.17-0.28 in
    16 iterations (see the README's Train section).
    """
    proc = subprocess.run(
        [sys.executable, "-m", "rlgw.bin.main", "--log-level", "warning", "train", "--config", str(CONFIG),
         "--model", str(warm_model), "--work-dir", str(tmp_path), "--iterations", "2", "--no-progress",
         "--dump-rollouts", str(tmp_path / "dumps")],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    receipts = [json.loads(line) for line in (tmp_path / "receipts.jsonl").read_text().splitlines()]
    assert receipts[0]["reward_mean"] < 0.2  # one city in eight by chance at most, before any reading
    for r in receipts:
        assert r["published"]["served_versions"] == [str(r["iteration"] + 1)]
        assert r["logprob_gap_max"] <= 1e-3 and r["is_ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    assert _tool_output_masked(tmp_path / "dumps" / "iteration-00000.jsonl")
