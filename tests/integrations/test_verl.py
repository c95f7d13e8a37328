"""The verl adapter with verl 0.9.1's real classes, in verl's own venv, on a real `rlgw serve` session.

verl pins transformers below the shared venv's, so it lives in `~/.cache/rlgw/agents/verl-0.9.1`
(Python 3.11, CPU torch), built from PyPI with only what `verl.experimental.agent_loop`, verl's
PPO loss and its v1 GRPO advantage import (`VERL_REQUIREMENTS`; verl itself `--no-deps`: its
metadata pulls wandb, peft's trainers, tensorboard, ...). The build takes several minutes, so it
happens only with `RLGW_INSTALL_TRAINERS=1`; without the venv the test skips. The probe
(`verl_probe.py`) runs the agent loops through verl's hydra instantiation and writes what verl got;
here it is compared field by field with the store.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.integrations.conftest import assert_same_tokens, run_probe, stored_samples
from tests.support.agent_venvs import agent_venv
from tests.support.e2e import Stack

pytestmark = pytest.mark.slow

VERL_VERSION = "0.9.1"
VERL_REQUIREMENTS = [
    "torch==2.13.0",  # the CPU build (the same pin as the README's install)
    "transformers>=5.5.3,<5.11,!=5.6.0",  # verl 0.9.1's own range
    "tensordict>=0.8,<=0.10,!=0.9.0",
    "hydra-core",
    "omegaconf",
    "ray>=2.41",
    "pillow",
    "pydantic",
    "numpy",
    "codetiming",
    "datasets",
    "cachetools",
    "fastapi",
    "uvicorn",
    "TransferQueue",  # verl's v1 trainer (list[AgentLoopOutput], multi-trajectory GRPO)
    "torchdata",
    "peft",
    # rlgw's client side and the test agents
    "httpx",
    "orjson",
    "openai",
]


@pytest.fixture(scope="module")
def verl_python() -> Path:
    venv = agent_venv(
        "verl",
        VERL_VERSION,
        VERL_REQUIREMENTS,
        python="3.11",
        opt_in=True,
        opt_in_var="RLGW_INSTALL_TRAINERS",
        no_deps=[f"verl=={VERL_VERSION}"],
    )
    return venv / "bin" / "python"


def test_verl_agent_loop_outputs_are_the_stored_samples(
    verl_python: Path, qwen3: Stack, tiny_qwen3: Path, tmp_path: Path
) -> None:
    report = run_probe(
        verl_python, "tests.integrations.verl_probe", qwen3, tiny_qwen3, tmp_path / "verl.json"
    )

    assert report["registry"]["rlgw"]["_target_"] == "rlgw.integrations.verl.RlgwAgentLoop"
    assert report["registry"]["rlgw_single"]["_target_"] == "rlgw.integrations.verl.RlgwSingleAgentLoop"
    outputs = report["outputs"]
    by_session: dict[str, list[dict]] = {}
    for o in outputs:
        by_session.setdefault(o["extra_fields"]["rlgw"]["session_id"], []).append(o)
    assert sorted(len(v) for v in by_session.values()) == [1, 2]  # the rewrite run forked in two
    for session_id, got in by_session.items():
        docs = stored_samples(qwen3, session_id)
        assert len(got) == len(docs)
        rollout_ids = {d["rollout_id"] for d in docs}
        assert len(rollout_ids) == 1 and {d["group_index"] for d in docs} == {3}  # one rollout, one group
        for o, doc in zip(got, docs, strict=True):
            p = len(doc["tokens"]) - doc["response_length"]
            assert o["prompt_ids"] == doc["tokens"][:p] and len(o["response_ids"]) == doc["response_length"]
            assert_same_tokens(
                doc, o["prompt_ids"] + o["response_ids"], o["response_mask"], o["response_logprobs"]
            )
            assert o["reward_score"] == doc["reward"]
            assert o["extra_fields"]["rlgw"]["cursor"] == doc["cursor"]
            assert o["extra_fields"]["rlgw"]["rollout_id"] in rollout_ids
    assert "takes one output per run" in report["single_error"]

    # verl's GRPO over the group {rewrite run: 1.0, one-segment run: 0.0}: both segments of the
    # forked run carry its session's advantage, as one rollout (v1 trainer's multi-trajectory path).
    if "advantages" in report:
        adv = dict(zip([o["key"] for o in outputs], report["advantages"], strict=True))
        assert adv["u3_s0_0"] == pytest.approx(adv["u3_s0_1"]) and adv["u3_s0_0"] > 0
        assert adv["u3_s1_0"] == pytest.approx(-adv["u3_s0_0"])
        np.testing.assert_allclose(abs(adv["u3_s0_0"]), 1 / np.sqrt(2), rtol=1e-4)

    # One verl PPO loss on CPU: finite, with a gradient, over exactly the mask-1 tokens.
    loss = report["loss"]
    trainable = sum(sum(o["response_mask"]) for o in outputs)
    assert loss["mask_tokens"] == trainable
    assert np.isfinite(loss["value"]) and loss["grad_abs_sum"] > 0
    assert loss["junk_value"] == loss["value"]  # log-probs on mask-0 positions change nothing
    assert loss["max_ratio_gap"] < 1e-3  # the trainer's log-probs are the engine's
    assert loss["value"] == pytest.approx(loss["manual_token_mean"], abs=1e-3)
