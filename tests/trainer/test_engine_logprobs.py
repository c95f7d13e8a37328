"""Both trainers compute the engine's logprobs: temperature and the padded vocabulary, through real sessions.

The model is the tiny Qwen3 fixture, perturbed at test time (every weight plus N(0, 0.03) noise) and with
its padded embedding rows (ids 4026..4095, past the tokenizer's 4026; tied, so also output rows) set to
N(0, 0.5): rows the engine masks out but that would carry mass in a plain `log_softmax`. One `rlgw serve`
(gateway + embedded engine) records sessions sampled at temperature 0.7 and 1.0; each trainer (PyTorch,
Megatron) runs the step at the served weights (no update), and the step's receipt metrics must show its
logprobs equal to the engine's: max |trainer - engine| <= 1e-3 and mean IS ratio 1 within 1e-3. Before
the trainers honoured either, the gap at 0.7 was about 2.9.
"""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from rlgw.gateway.sample import Sample, SampleStatus, VersionSpan
from rlgw.gateway.trajectories.client import GatewayClient, StoredTrajectory
from rlgw.trainer.batch import TemperatureError, build_step, sample_temperature
from rlgw.trainer.consumer import AcceptancePolicy, TrajectoryConsumer, to_rollouts
from rlgw.trainer.objective import LossConfig
from rlgw.trainer.rollouts import ChatRollouts, WordTask
from rlgw.trainer.services import local_services
from rlgw.trainer.torch_trainer import OptimConfig, TorchTrainer
from tests.support.procs import FIXTURES

TEMPERATURES = (0.7, 1.0)
OPTIM = OptimConfig(lr=0.0)
HAS_MEGATRON = importlib.util.find_spec("megatron") is not None and (
    importlib.util.find_spec("megatron.core") is not None
)


def padded_perturbed_model(dst: Path, tokenizer_vocab: int = 4026) -> Path:
    """tiny-qwen3 with noisy weights and padded rows far from zero (see the module docstring)."""
    shutil.copytree(FIXTURES / "tiny-qwen3", dst)
    gen = torch.Generator().manual_seed(0)
    state = load_file(str(dst / "model.safetensors"))
    for name, t in state.items():
        state[name] = t + 0.03 * torch.randn(t.shape, generator=gen, dtype=t.dtype)
    emb = state["model.embed_tokens.weight"]
    assert emb.shape[0] > tokenizer_vocab  # the fixture pads its vocabulary
    emb[tokenizer_vocab:] = 0.5 * torch.randn(emb[tokenizer_vocab:].shape, generator=gen)
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


async def _record(model: Path, work: Path) -> dict[float, list[StoredTrajectory]]:
    out: dict[float, list[StoredTrajectory]] = {}
    with local_services(str(model), work) as svc:
        async with GatewayClient(svc.gateway_url, svc.gateway_key) as gw:
            consumer = TrajectoryConsumer(gw, work / "cursor")
            for i, t in enumerate(TEMPERATURES):
                task = WordTask("Answer with one word: It", "It")
                source = ChatRollouts([task], groups=2, group_size=4, max_tokens=12, temperature=t, seed=i)
                got = await source.collect(svc.gateway_url, svc.gateway_key, i)
                assert got.last_cursor is not None and not got.failed_runs
                out[t] = await consumer.read_through(got.last_cursor)
    return out


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[float, list[StoredTrajectory]]]:
    root = tmp_path_factory.mktemp("padded")
    model = padded_perturbed_model(root / "model")
    return model, asyncio.run(_record(model, root))


def _megatron_trainer(model: Path):
    from rlgw.trainer.megatron_trainer import MegatronTrainer

    return MegatronTrainer(model, LossConfig(), OPTIM)


@pytest.fixture(scope="module")
def megatron_groups():
    """Megatron's process groups for this module only (other tests may form their own)."""
    yield
    if HAS_MEGATRON:
        import torch.distributed as dist
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("backend", ["torch", "megatron"])
def test_trainer_logprobs_equal_the_engines(
    recorded, megatron_groups, backend: str, temperature: float
) -> None:
    if backend == "megatron" and not HAS_MEGATRON:
        pytest.skip("megatron-core is not installed (pip install -e '.[train]')")
    model, by_temperature = recorded
    items = by_temperature[temperature]
    # the gateway recorded the temperature of every turn
    assert {sample_temperature(t.sample) for t in items} == {temperature}
    rollouts, _ = to_rollouts(items, AcceptancePolicy())
    assert len(rollouts) == 8 and sum(r.trainable_tokens for r in rollouts) >= 16
    trainer = _megatron_trainer(model) if backend == "megatron" else TorchTrainer(model, LossConfig(), OPTIM)
    metrics = trainer.loss_and_backward(build_step(rollouts, micro_batch_rows=3))
    assert metrics["logprob_gap_max"] <= 1e-3, metrics
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-3), metrics


def _sample(turns: list[dict] | None) -> Sample:
    meta = {} if turns is None else {"turn_temperature": turns}
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
    from rlgw.trainer.batch import Rollout

    with pytest.raises(TemperatureError, match=says.replace("[", r"\[").replace("]", r"\]")):
        build_step([Rollout("r0", 0, 1.0, [_sample(turns)])], micro_batch_rows=1)
