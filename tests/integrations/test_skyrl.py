"""The SkyRL adapter with skyrl-train 0.3.1's real classes (Python 3.12) on a real `rlgw serve` session.

`skyrl-train` requires Python 3.12 and declares flash-attn and many services it does not import on
the paths used here, so `~/.cache/rlgw/agents/skyrl-train-0.3.1` gets only
what `skyrl_train.generators`, its batching and its PPO utilities import (`SKYRL_REQUIREMENTS`;
`skyrl-train` and `skyrl-gym` themselves `--no-deps`). PyPI's torch for Linux is the CUDA build, so
that venv also holds the CUDA runtime wheels (several GB; the tests still run on CPU): it is built
only with `RLGW_INSTALL_TRAINERS=1`, and the test skips without it. The probe (`skyrl_probe.py`)
writes what SkyRL got; here it is compared field by field with the store.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.integrations.conftest import assert_same_tokens, run_probe, stored_samples, stream
from tests.support.agent_venvs import agent_venv
from tests.support.e2e import Stack

pytestmark = pytest.mark.slow

SKYRL_VERSION = "0.3.1"
SKYRL_REQUIREMENTS = [
    "torch==2.13.0",
    "transformers>=4.51",
    "ray==2.51.1",  # skyrl-train's pin
    "hydra-core==1.3.2",
    "omegaconf",
    "loguru",
    "jaxtyping",
    "tensordict",
    "numpy",
    "tqdm",
    "pandas",  # the rest: imported by skyrl_gym and skyrl_train's inference-engine client
    "datasets",
    "fastapi",
    "uvicorn",
    # rlgw's client side and the test agents
    "httpx",
    "orjson",
    "openai",
]
SKYRL_NO_DEPS = [f"skyrl-train=={SKYRL_VERSION}", "skyrl-gym"]


@pytest.fixture(scope="module")
def skyrl_python() -> Path:
    venv = agent_venv("skyrl-train", SKYRL_VERSION, SKYRL_REQUIREMENTS, python="3.12", opt_in=True,
                      opt_in_var="RLGW_INSTALL_TRAINERS", no_deps=SKYRL_NO_DEPS)  # fmt: skip
    return venv / "bin" / "python"


def test_skyrl_generator_output_is_the_stored_samples(
    skyrl_python: Path, qwen3: Stack, tiny_qwen3: Path, tmp_path: Path
) -> None:
    report = run_probe(
        skyrl_python, "tests.integrations.skyrl_probe", qwen3, tiny_qwen3, tmp_path / "skyrl.json"
    )
    o = report["output"]

    # Rows: the forked run's two segments (one trajectory), then the one-segment run.
    assert o["trajectory_ids"] == ["weather_0", "weather_0", "weather_1"]
    assert o["is_last_step"] == [False, True, True]
    assert o["rewards"] == [1.0, 1.0, 0.0]
    assert o["stop_reasons"] == ["stop", "stop", "stop"]
    rollout_ids = {}
    for tid in ("weather_0", "weather_1"):
        rows = [i for i, t in enumerate(o["trajectory_ids"]) if t == tid]
        docs = stored_samples_for(qwen3, tid)
        assert len(docs) == len(rows)
        rollout_ids[tid] = {d["rollout_id"] for d in docs}
        assert len(rollout_ids[tid]) == 1 and {d["group_index"] for d in docs} == {
            0
        }  # one rollout, one group
        for i, doc in zip(rows, docs, strict=True):
            tokens = o["prompt_token_ids"][i] + o["response_ids"][i]
            assert_same_tokens(doc, tokens, o["loss_masks"][i], o["rollout_logprobs"][i])
            assert len(o["response_ids"][i]) == doc["response_length"] and o["rewards"][i] == doc["reward"]
    assert rollout_ids["weather_0"] != rollout_ids["weather_1"]
    assert "step_wise_trajectories" in report["refused"]

    # SkyRL's batch keeps the masks and logprobs (right-padded with 0).
    for i, mask in enumerate(o["loss_masks"]):
        assert report["batch"]["loss_mask"][i][: len(mask)] == mask
        assert not any(report["batch"]["loss_mask"][i][len(mask) :])
        np.testing.assert_array_equal(
            np.asarray(report["batch"]["rollout_logprobs"][i][: len(mask)], dtype=np.float32),
            np.asarray(o["rollout_logprobs"][i], dtype=np.float32),
        )
    # GRPO on last rows, broadcast: the forked trajectory's two rows share its advantage.
    adv = report["advantages"]
    assert adv[0] == pytest.approx(adv[1]) and adv[0] > 0 and adv[2] == pytest.approx(-adv[0])

    loss = report["loss"]
    assert loss["mask_tokens"] == sum(sum(m) for m in o["loss_masks"])
    assert np.isfinite(loss["value"]) and loss["grad_abs_sum"] > 0
    assert loss["junk_value"] == loss["value"]  # log-probs on mask-0 positions change nothing
    assert loss["max_ratio_gap"] < 1e-3
    assert loss["value"] == pytest.approx(loss["manual_token_mean"], abs=1e-3)


def stored_samples_for(st: Stack, trajectory: str) -> list[dict]:
    """The stored samples of the session whose rollout id names SkyRL's trajectory id."""
    docs = stream(st)
    sessions = {d["session_id"] for d in docs if f"-{trajectory}-" in d["rollout_id"]}
    # The refused (non-step-wise) run used the same trajectory id: take the first, step-wise, session.
    first = min(sessions, key=lambda s: min(d["cursor"] for d in docs if d["session_id"] == s))
    return stored_samples(st, first)
