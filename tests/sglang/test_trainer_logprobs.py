"""Both trainers compute real SGLang's logprobs: temperature and the padded vocabulary.

SGLang 0.5.23 serves the perturbed tiny Qwen3 (`padded_perturbed_model`: padded rows far from zero)
behind the recording proxy and `rlgw serve`, one server for this module; the word task is recorded
at temperature 0.7 and 1.0 and each trainer runs the step at the served weights. SGLang normalizes
its sampled logprobs over the whole padded vocabulary, scaled by 1/T, and the samples must say so;
the trainers then match it within 1e-3, while normalizing over the tokenizer's vocabulary misses by
far more (the before/after figures are printed: `pytest -s`). SGLang also samples padded ids now and
then: the gateway keeps those sessions (the id is what the model sampled; `config.vocab_size` bounds
the ids, not the tokenizer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlgw.gateway.trajectories.client import StoredTrajectory
from tests.support import trainer_logprobs
from tests.support.sglang_env import sglang_python, sglang_stack
from tests.support.trainer_logprobs import (
    BACKENDS,
    TEMPERATURES,
    assert_trainer_matches_engine,
    make_trainer,
    padded_ids_sampled,
    padded_perturbed_model,
    record_word_task,
)

megatron_groups = trainer_logprobs.megatron_groups  # torn down with this module


@pytest.fixture(scope="module")
def recorded(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Path, dict[float, list[StoredTrajectory]]]]:
    sglang_python()  # skips, naming the build command, before anything starts
    root = tmp_path_factory.mktemp("sglang-padded")
    model = padded_perturbed_model(root / "model")
    with sglang_stack(model, root) as st:
        yield model, asyncio.run(record_word_task(st.gateway, root))


def test_the_samples_say_what_sglang_does(recorded) -> None:
    _, by_temperature = recorded
    for items in by_temperature.values():
        engines = [t.sample.metadata["engine"] for t in items]
        assert {e["kind"] for e in engines} == {"sglang"}
        assert {e["version"] for e in engines} == {"0.5.23"}
        assert {(e["logprobs"], e["forced_logprobs"], e["vocabulary"]) for e in engines} == {
            ("scaled", "raw", "padded")
        }
        assert {e["seed_honoured"] for e in engines} == {False}  # no deterministic inference on CPU
        assert len({t.sample.rollout_id for t in items}) == 8  # none rejected, padded ids or not
    sampled = sum(padded_ids_sampled(items) for items in by_temperature.values())
    print(f"SGLang sampled {sampled} padded ids over the recorded sessions")


@pytest.mark.usefixtures("megatron_groups")
@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_trainer_logprobs_equal_sglangs(recorded, backend: str, temperature: float) -> None:
    model, by_temperature = recorded
    assert_trainer_matches_engine(
        make_trainer(backend, model), by_temperature[temperature], temperature, f"SGLang {backend}"
    )
