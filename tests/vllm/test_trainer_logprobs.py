"""Both trainers compute real vLLM's logprobs: raw logprobs over the padded vocabulary.

vLLM 0.32.0 (CPU) serves the perturbed tiny Qwen3 (`padded_perturbed_model`: padded rows far from
zero) built on the 64-wide-heads copy its CPU attention needs (`qwen3_hd64`, untied head), one
server for this module; the word task is recorded at temperature 0.7 and 1.0 and each trainer runs
the step at the served weights. vLLM's default `raw_logprobs` are `log_softmax` of the model's
logits over `config.vocab_size`, whatever the temperature, and the samples must say so; the
trainers then match it within 1e-3, while normalizing over the tokenizer's vocabulary misses by far
more (figures printed: `pytest -s`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlgw.gateway.trajectories.client import StoredTrajectory
from tests.support import trainer_logprobs
from tests.support.trainer_logprobs import (
    BACKENDS,
    TEMPERATURES,
    assert_trainer_matches_engine,
    make_trainer,
    padded_ids_sampled,
    padded_perturbed_model,
    record_word_task,
)
from tests.support.vllm_env import vllm_python, vllm_stack

megatron_groups = trainer_logprobs.megatron_groups  # torn down with this module


@pytest.fixture(scope="module")
def recorded(
    qwen3_hd64: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, dict[float, list[StoredTrajectory]]]]:
    vllm_python()  # skips, naming the build command, before anything starts
    root = tmp_path_factory.mktemp("vllm-padded")
    model = padded_perturbed_model(root / "model", src=qwen3_hd64)
    with vllm_stack(model, root) as st:
        yield model, asyncio.run(record_word_task(st.gateway, root))


def test_the_samples_say_what_vllm_does(recorded) -> None:
    _, by_temperature = recorded
    for items in by_temperature.values():
        engines = [t.sample.metadata["engine"] for t in items]
        assert {e["kind"] for e in engines} == {"vllm"}
        assert {e["version"] for e in engines} == {"0.32.0"}
        assert {(e["logprobs"], e["forced_logprobs"], e["vocabulary"]) for e in engines} == {
            ("raw", "raw", "padded")
        }
        assert {(e["logprobs_mode"], e["logprobs_mode_reported"]) for e in engines} == {
            ("raw_logprobs", True)
        }
        assert len({t.sample.rollout_id for t in items}) == 8  # none rejected, padded ids or not
    sampled = sum(padded_ids_sampled(items) for items in by_temperature.values())
    print(f"vLLM sampled {sampled} padded ids over the recorded sessions")


@pytest.mark.usefixtures("megatron_groups")
@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_trainer_logprobs_equal_vllms(recorded, backend: str, temperature: float) -> None:
    model, by_temperature = recorded
    assert_trainer_matches_engine(
        make_trainer(backend, model), by_temperature[temperature], temperature, f"vLLM {backend}"
    )
