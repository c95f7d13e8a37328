"""Both trainers compute the engine's logprobs: temperature and the padded vocabulary, through real sessions.

The model is the tiny Qwen3 fixture perturbed at test time with its padded rows far from zero
(`tests.support.trainer_logprobs.padded_perturbed_model`). One engine, the recording proxy and
`rlgw serve` (`tests.support.e2e.stack`) record sessions sampled at temperature 0.7 and 1.0; each
trainer (PyTorch, Megatron) runs the step at the served weights (no update), and the step's receipt
metrics must show its logprobs equal to the engine's: max |trainer - engine| <= 1e-3 and mean IS
ratio 1 within 1e-3. The engine normalizes over the model's whole (padded) vocabulary, as SGLang and
vLLM do, and the samples say so (`metadata.engine`); a trainer normalizing over the tokenizer's
vocabulary instead is off by far more (checked below, so the fixture keeps its teeth). Before the
trainers honoured the temperature, the gap at 0.7 was about 2.9. The real-SGLang and vLLM tiers run
the same helpers on their own `Stack`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from rlgw.gateway.engine_semantics import PROCESSED, RAW, EngineSemanticsError, embedded_semantics
from rlgw.gateway.sample import Sample, SampleStatus, VersionSpan
from rlgw.gateway.trajectories.client import StoredTrajectory
from rlgw.trainer.batch import Rollout, TemperatureError, build_step, sample_temperature
from tests.support import trainer_logprobs
from tests.support.e2e import stack
from tests.support.trainer_logprobs import (
    BACKENDS,
    TEMPERATURES,
    assert_trainer_matches_engine,
    make_trainer,
    padded_perturbed_model,
    record_word_task,
)

megatron_groups = trainer_logprobs.megatron_groups  # torn down with this module


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[float, list[StoredTrajectory]]]:
    root = tmp_path_factory.mktemp("padded")
    model = padded_perturbed_model(root / "model")
    with stack(model, root / "gateway") as st:
        return model, asyncio.run(record_word_task(st.gateway, root))


@pytest.mark.usefixtures("megatron_groups")
@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_trainer_logprobs_equal_the_engines(recorded, backend: str, temperature: float) -> None:
    model, by_temperature = recorded
    items = by_temperature[temperature]
    assert {t.sample.metadata["engine"]["vocabulary"] for t in items} == {"padded"}
    assert len({t.sample.rollout_id for t in items}) == 8  # every session kept
    assert_trainer_matches_engine(make_trainer(backend, model), items, temperature, f"embedded {backend}")


def _sample(turns: list[dict] | None, engine: dict | None = None) -> Sample:
    meta = {"engine": engine or embedded_semantics("test").to_metadata()}
    if turns is not None:
        meta["turn_temperature"] = turns
    return Sample(np.arange(6, dtype=np.int32), 2, np.ones(2, np.uint8), np.full(2, -1.0, np.float32), 1.0,
                  SampleStatus.COMPLETED, "r0", 0, [VersionSpan("0", 0, 2)], meta)  # fmt: skip


def test_a_segment_is_scaled_by_its_turns_temperature_and_greedy_is_unscaled() -> None:
    two_turns = [{"turn": 0, "temperature": 0.7}, {"turn": 1, "temperature": 0.7}]
    assert sample_temperature(_sample(two_turns)) == 0.7
    assert sample_temperature(_sample([{"turn": 0, "temperature": 0.0}])) == 1.0


@pytest.mark.parametrize(
    ("turns", "says"),
    [
        (None, "no turn_temperature"),
        ([{"turn": 0, "temperature": 0.7}, {"turn": 1, "temperature": 1.0}], "mixes temperatures [0.7, 1.0]"),
    ],
)
def test_a_step_whose_temperature_cannot_be_honoured_is_refused(turns, says: str) -> None:
    with pytest.raises(TemperatureError, match=says.replace("[", r"\[").replace("]", r"\]")):
        build_step([Rollout("r0", 0, 1.0, [_sample(turns)])], micro_batch_rows=1)


AT_07 = [{"turn": 0, "temperature": 0.7}]


def test_raw_logprobs_are_not_scaled_by_the_temperature() -> None:
    """vLLM's raw_logprobs (and `--return-original-logprob`): the row's temperature is 1."""
    raw = embedded_semantics("test", original_logprob=True).to_metadata()
    (mb,) = build_step([Rollout("r0", 0, 1.0, [_sample(AT_07, raw)])], micro_batch_rows=1).micro_batches
    assert mb.temperature.tolist() == [1.0] and mb.vocabulary == "padded"
    (mb,) = build_step([Rollout("r0", 0, 1.0, [_sample(AT_07)])], micro_batch_rows=1).micro_batches
    assert mb.temperature.tolist() == pytest.approx([0.7])


def _engine(**changes) -> dict:
    return {**embedded_semantics("test").to_metadata(), **changes}


@pytest.mark.parametrize(
    ("engines", "says"),
    [
        ([None], "no metadata.engine"),
        ([{"kind": "vllm"}], "lacks version"),
        (
            [_engine(logprobs=PROCESSED)],
            "'processed' logprobs over the 'padded' vocabulary, which the trainers cannot",
        ),
        ([_engine(vocabulary="half")], "over the 'half' vocabulary"),
        ([_engine(), _engine(logprobs=RAW)], "mixes engine logprob semantics"),
        ([_engine(), _engine(kind="sglang")], "mixes engine logprob semantics"),
    ],
)
def test_a_step_whose_engine_semantics_cannot_be_reproduced_is_refused(engines: list, says: str) -> None:
    rollouts = []
    for i, engine in enumerate(engines):
        sample = _sample(AT_07)
        if engine is None:
            del sample.metadata["engine"]
        else:
            sample.metadata["engine"] = engine
        rollouts.append(Rollout(f"r{i}", 0, 1.0, [sample]))
    with pytest.raises(EngineSemanticsError, match=says):
        build_step(rollouts, micro_batch_rows=1)
