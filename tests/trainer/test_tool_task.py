"""The built-in tool task (trainer/configs/tool-tiny*.json): its verifier, fixture, and sessions that learn.

The runs are real `rlgw train` processes on `tests/fixtures/tiny-reader` (pretrained to copy a value out of
a user message or another tool's result, never out of `locate`'s) after the task's format warm start
(`warm_start`, once per module: it calls `locate`, then answers a city drawn apart from the result, so
iteration 0 reads by chance): two-turn gateway sessions with `tools=[locate]`, the tool's result sent back as
a `tool` message (mask 0), the trainer's logprobs equal to the engine's on every token. Slow: two iterations.
Long (`RLGW_LONG=1`), the goal: the reward rises from below 0.2 in the first iteration to above 0.8 in the
last two, for three seeds with the torch trainer and once with Megatron at tp=2 on two processes.
"""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import numpy as np
import pytest

from rlgw.trainer.config import TrainConfig
from rlgw.trainer.tool_task import CITIES, group_cities, tool_reward, warm_start, warm_start_pairs
from tests.support.procs import FIXTURES, REPO
from tests.trainer.support import run_train

CONFIG = REPO / "trainer" / "configs" / "tool-tiny.json"
MEGATRON_CONFIG = REPO / "trainer" / "configs" / "tool-tiny-megatron.json"
READER = FIXTURES / "tiny-reader"


def test_the_verifier_pays_a_call_and_the_results_city_only() -> None:
    assert tool_reward(True, "Cairo", "Cairo") == 1.0
    assert tool_reward(True, " Cairo.", "Cairo") == 1.0
    assert tool_reward(True, "Dublin", "Cairo") == 0.0
    assert tool_reward(False, "Cairo", "Cairo") == 0.0  # right by chance, without calling the tool
    assert tool_reward(True, None, "Cairo") == 0.0


def test_a_group_reads_one_city_and_an_iteration_every_city() -> None:
    cities = group_cities(random.Random(3), 8)
    assert sorted(cities) == sorted(CITIES) and cities == group_cities(random.Random(3), 8)
    assert sorted(group_cities(random.Random(3), 16)) == sorted(CITIES * 2)


def test_the_warm_start_answers_every_city_alike_and_apart_from_the_result() -> None:
    rng = random.Random(0)
    steps = [warm_start_pairs(rng, 8) for _ in range(200)]
    for pairs in steps:
        assert sorted(a for _, a in pairs) == sorted(r for r, _ in pairs) == sorted(CITIES)
    same = sum(r == a for pairs in steps for r, a in pairs) / (8 * len(steps))
    assert abs(same - 1 / 8) < 0.03  # the answer does not follow the result


def test_the_configs_are_the_tool_task_on_each_trainer() -> None:
    torch_cfg, megatron_cfg = TrainConfig.from_file(CONFIG), TrainConfig.from_file(MEGATRON_CONFIG)
    assert torch_cfg.rollouts.kind == megatron_cfg.rollouts.kind == "tool"
    assert (torch_cfg.trainer, megatron_cfg.trainer, megatron_cfg.parallel.world) == ("torch", "megatron", 2)


def test_the_reader_fixture_copies_a_value_out_of_another_tools_result() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.fixtures.build_reader_fixture import next_probs, tool_turns

    tok = AutoTokenizer.from_pretrained(READER)
    model = AutoModelForCausalLM.from_pretrained(READER).eval()
    rng = random.Random(0)
    for value in ("Nairobi", "Parser", "Handler"):
        tools, turns = tool_turns(value, rng)
        assert tok.decode(int(next_probs(model, tok, turns[1][0], tools).argmax())) == value


def train(config: Path, work: Path, *extra: str) -> list[dict]:
    """`rlgw train`'s receipts, each checked: served version i+1, trainer logprobs equal to the engine's."""
    receipts = run_train(config, work, *extra)
    for r in receipts:
        assert r["published"]["served_versions"] == [str(r["iteration"] + 1)]
        assert r["logprob_gap_max"] <= 1e-3 and r["is_ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    return receipts


def _tool_output_masked(dump: Path) -> bool:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(READER)
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
    return warm_start(READER, tmp_path_factory.mktemp("tool") / "model")


@pytest.mark.slow
def test_tool_sessions_train_with_the_tool_output_masked(warm_model: Path, tmp_path: Path) -> None:
    """Two iterations: the warm-started model calls the tool, its result is mask 0, logprobs agree."""
    receipts = train(CONFIG, tmp_path, "--model", str(warm_model), "--iterations", "2",
                     "--dump-rollouts", str(tmp_path / "dumps"))  # fmt: skip
    # one city in eight by chance before any reading; 64 sessions put 0.3 four standard deviations above it
    assert receipts[0]["reward_mean"] < 0.3
    assert _tool_output_masked(tmp_path / "dumps" / "iteration-00000.jsonl")


def _learns(receipts: list[dict]) -> None:
    rewards = [r["reward_mean"] for r in receipts]
    assert rewards[0] < 0.2, rewards
    assert sum(rewards[-2:]) / 2 > 0.8, rewards


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_tool_task_learns_to_read_the_result(warm_model: Path, tmp_path: Path, seed: int) -> None:
    _learns(train(CONFIG, tmp_path, "--model", str(warm_model), "--seed", str(seed)))


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core is not installed")
def test_the_tool_task_learns_with_megatron_tp2(warm_model: Path, tmp_path: Path) -> None:
    _learns(train(MEGATRON_CONFIG, tmp_path, "--model", str(warm_model), "--nproc-per-node", "2"))
