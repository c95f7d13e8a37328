"""The slime adapter against the facts read from slime's source (`slime_facts.json`, commit pinned there).

slime is not on PyPI, so its `Sample` is rebuilt here from the recorded facts (field names, the
Status enum's members and values) and the adapter's output is checked against it: every attribute
it sets is one of slime's fields, statuses are members of slime's enum, the hook signatures are the
ones slime calls. The generate function runs a real capture session through `rlgw serve` (two
segments: a tool loop, then a rewrite) and what slime would get is compared field by field with the
stored samples; slime's own per-rollout loss denominator (`rollout_mask_sums` and
`get_sum_of_sample_mean`, copied below from the cited lines) is computed on it with torch on CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import inspect
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlgw.integrations import slime
from rlgw.integrations.settings import SettingsError
from tests.integrations.conftest import assert_same_tokens, stored_samples
from tests.support.e2e import Stack

FACTS = json.loads((Path(__file__).parent / "slime_facts.json").read_text())
FIELDS = [f["name"] for f in FACTS["sample"]["fields"]]


def _fact_sample_class() -> type:
    """slime's `Sample` as the facts say: its field names, and a `Status` enum of its values."""
    status = enum.Enum("Status", FACTS["sample"]["status_enum"]["members"])
    mutable = {"tokens": list, "apply_chat_template_kwargs": dict, "weight_versions": list, "metadata": dict}
    spec = []
    for name in FIELDS:
        if name in mutable:
            spec.append((name, Any, dataclasses.field(default_factory=mutable[name])))
        elif name == "status":
            spec.append((name, Any, dataclasses.field(default=status.PENDING)))
        else:
            spec.append((name, Any, dataclasses.field(default=None)))
    cls = dataclasses.make_dataclass("Sample", spec)
    cls.Status = status
    return cls


SlimeSample = _fact_sample_class()


def _args(st: Stack, runner: str, **extra: Any) -> argparse.Namespace:
    return argparse.Namespace(rlgw_gateway_url=st.gateway, rlgw_runner=runner, **extra)


def _check_fields(sample: Any) -> None:
    # copy.copy + setattr on a dataclass would silently grow a misspelt attribute: none may exist.
    assert set(vars(sample)) <= set(FIELDS), set(vars(sample)) - set(FIELDS)
    assert isinstance(sample.status, SlimeSample.Status)


def test_facts_match_the_status_vocabulary_rlgw_maps() -> None:
    from rlgw.gateway.sample import SampleStatus

    members = FACTS["sample"]["status_enum"]["members"]
    assert {s.value for s in SampleStatus} <= set(members.values())
    for name in (
        "tokens",
        "response_length",
        "loss_mask",
        "rollout_log_probs",
        "reward",
        "status",
        "rollout_id",
        "group_index",
        "weight_versions",
        "metadata",
        "session_id",
        "index",
    ):
        assert name in FIELDS


def test_hook_signatures_are_the_ones_slime_calls() -> None:
    gen = FACTS["custom_generate"]
    params = list(inspect.signature(slime.generate).parameters)
    assert params[:3] == gen["parameters"] and params[3] == gen["optional_keyword"]
    assert inspect.iscoroutinefunction(slime.generate)
    assert (
        list(inspect.signature(slime.reward_post_process).parameters)
        == FACTS["reward_post_process"]["parameters"]
    )
    assert slime.GROUP_NORMALIZED == tuple(FACTS["reward_post_process"]["default_group_estimators"])
    assert slime.STD_NORMALIZED == tuple(FACTS["reward_post_process"]["default_std_estimators"])


async def test_generate_returns_the_stored_segments_as_slime_samples(qwen3: Stack) -> None:
    sample = SlimeSample(
        index=7, group_index=3, prompt="unused", session_id="slime-session-7", metadata={"task_id": "weather"}
    )
    out = await slime.generate(
        _args(qwen3, "tests.integrations.agents:rewrite_agent"), sample, {"temperature": 0.0, "top_p": 1.0}
    )
    assert len(out) == 2
    session_id = out[0].metadata["rlgw"]["session_id"]
    docs = stored_samples(qwen3, session_id)
    assert [d["metadata"]["segment_cause"] for d in docs] == ["start", "rewrite"]
    for s, doc in zip(out, docs, strict=True):
        _check_fields(s)
        assert_same_tokens(doc, s.tokens, s.loss_mask, s.rollout_log_probs)
        assert s.response_length == doc["response_length"]
        assert s.status is SlimeSample.Status.COMPLETED and doc["status"] == "completed"
        assert s.reward == doc["reward"] == 1.0  # the verifier's reward on every sibling, not divided
        assert s.rollout_id == 7 and doc["rollout_id"] == "slime-session-7"  # slime's int, rlgw's str
        assert s.group_index == 3 == doc["group_index"]
        assert s.weight_versions == [v["version"] for v in doc["weight_versions"]]
        assert s.metadata["task_id"] == "weather" and s.metadata["rlgw"]["cursor"] == doc["cursor"]
    assert sample.tokens == [] and sample.status is SlimeSample.Status.PENDING  # slime's own sample untouched

    # slime's per-rollout loss denominator (slime/ray/rollout.py 686-700), on what it would get.
    rollout_ids = [s.rollout_id for s in out]
    totals: dict[int, int] = {}
    for rid, m in zip(rollout_ids, (sum(s.loss_mask) for s in out), strict=True):
        totals[rid] = totals.get(rid, 0) + m
    rollout_mask_sums = [totals[rid] for rid in rollout_ids]
    trainable = sum(sum(d["loss_mask"]) for d in docs)
    assert rollout_mask_sums == [trainable, trainable]
    _check_loss_is_one_rollout_mean(out, rollout_mask_sums)


def _check_loss_is_one_rollout_mean(out: list[Any], denoms: list[int]) -> None:
    """slime's `sum_of_sample_mean` (cp_utils.py 73-81) on per-token losses is the rollout's token mean."""
    torch = pytest.importorskip("torch")
    lengths = [s.response_length for s in out]
    masks = [torch.tensor(s.loss_mask, dtype=torch.float32) for s in out]
    # Per-token losses: 1, 2, 3, ... on the trainable tokens and a huge value on every mask-0 token.
    gen = torch.arange(1, sum(lengths) + 1, dtype=torch.float32)
    flat_mask = torch.cat(masks)
    x = torch.where(flat_mask.bool(), gen, torch.full_like(gen, 1e9))
    loss = sum(
        (x_i * m_i).sum() / torch.clamp_min(torch.tensor(float(d)), 1)
        for x_i, m_i, d in zip(x.split(lengths, dim=0), masks, denoms, strict=True)
    )
    expected = gen[flat_mask.bool()].mean()  # one mean over the rollout's mask-1 tokens
    assert torch.isfinite(loss) and torch.allclose(loss, expected)
    per_segment = sum((x_i * m_i).sum() / m_i.sum() for x_i, m_i in zip(x.split(lengths), masks, strict=True))
    assert not torch.allclose(loss, per_segment)  # the segments do not count as two rollouts


async def test_a_failed_run_is_one_aborted_sample_with_its_reason(qwen3: Stack) -> None:
    sample = SlimeSample(index=8, group_index=0, prompt="unused", session_id="slime-session-8")
    out = await slime.generate(_args(qwen3, "tests.integrations.agents:failing_agent"), sample, {})
    assert len(out) == 1
    _check_fields(out[0])
    assert out[0].status is SlimeSample.Status.ABORTED and out[0].rollout_id == 8
    assert "RuntimeError: the sandbox went away" in out[0].metadata["rlgw_abort_reason"]
    assert out[0].tokens == []


async def test_bad_settings_fail_before_any_session() -> None:
    with pytest.raises(SettingsError, match="no rlgw gateway"):
        await slime.generate(argparse.Namespace(), SlimeSample(index=1), {})
    ns = argparse.Namespace(rlgw_gateway_url="http://127.0.0.1:9", rlgw_runner="chat")
    with pytest.raises(SettingsError, match="needs reward"):
        await slime.generate(ns, SlimeSample(index=1), {})


def _grpo(**kw: Any) -> argparse.Namespace:
    base = {
        "advantage_estimator": "grpo",
        "rewards_normalization": True,
        "grpo_std_normalization": True,
        "reward_key": None,
    }
    return argparse.Namespace(**{**base, **kw})


def test_reward_post_process_counts_a_forked_rollout_once_in_its_group() -> None:
    # Group 0: rollout 1 forked into two samples (reward 1), rollouts 2 and 3 one sample each (0, 0).
    # Group 5: rollouts 4 and 5 (reward 1 and 0).
    rows = [(0, 1, 1.0), (0, 1, 1.0), (0, 2, 0.0), (0, 3, 0.0), (5, 4, 1.0), (5, 5, 0.0)]
    samples = [
        SlimeSample(group_index=g, rollout_id=r, index=i, reward=w) for i, (g, r, w) in enumerate(rows)
    ]
    raw, norm = slime.reward_post_process(_grpo(), samples)
    assert raw == [w for _, _, w in rows]
    g0 = np.array([1.0, 0.0, 0.0])  # one value per rollout, as slime's default on unforked groups
    z0 = (g0 - g0.mean()) / (g0.std(ddof=1) + 1e-6)
    g5 = np.array([1.0, 0.0])
    z5 = (g5 - g5.mean()) / (g5.std(ddof=1) + 1e-6)
    np.testing.assert_allclose(norm, [z0[0], z0[0], z0[1], z0[2], z5[0], z5[1]], rtol=1e-6)
    # Counting each row (slime's default shape) would have given rollout 1 two votes: a different mean.
    assert not np.isclose(np.mean([1.0, 1.0, 0.0, 0.0]), g0.mean())

    _, centred = slime.reward_post_process(_grpo(grpo_std_normalization=False), samples)
    np.testing.assert_allclose(centred[:4], g0[[0, 0, 1, 2]] - g0.mean())
    assert slime.reward_post_process(_grpo(advantage_estimator="ppo"), samples) == (raw, raw)


def test_reward_post_process_refuses_siblings_with_different_rewards() -> None:
    samples = [
        SlimeSample(group_index=0, rollout_id=1, reward=1.0),
        SlimeSample(group_index=0, rollout_id=1, reward=0.0),
    ]
    with pytest.raises(ValueError, match="rollout 1 of group 0"):
        slime.reward_post_process(_grpo(), samples)


def test_the_example_config_builds_its_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    examples = Path(__file__).resolve().parents[2] / "examples"
    monkeypatch.syspath_prepend(str(examples))
    args = argparse.Namespace(**yaml.safe_load((examples / "slime" / "rlgw.yaml").read_text()))
    settings = slime.settings_from_args(args)
    runner = settings.build_runner()
    from weather_agent import agent

    assert runner.agent is agent and settings.max_turns == 8


@pytest.mark.slow
async def test_generate_runs_an_rlgw_scaffold_graded_by_its_verifier(qwen3: Stack) -> None:
    task = {
        "id": "weather-mini",
        "instruction": "What is the weather in Paris?",
        "setup_files": {"README.md": "notes\n"},
        "verifier": {
            "command": "test -f README.md && echo '{\"reward\": 0.5}' > $RLGW_REWARD_DIR/reward.json"
        },
    }
    sample = SlimeSample(index=9, group_index=1, prompt="unused", session_id="slime-session-9",
                         metadata={"rlgw_task": task})  # fmt: skip
    args = _args(qwen3, "scaffold:rlgw-mini", rlgw_max_turns=2,
                 rlgw_scaffold_options={"python": sys.executable, "max_tokens": 64})  # fmt: skip
    out = await slime.generate(args, sample, {"temperature": 0.0})
    assert out and all(s.status is not SlimeSample.Status.ABORTED for s in out), out[0].metadata
    docs = stored_samples(qwen3, out[0].metadata["rlgw"]["session_id"])
    assert len(docs) == len(out)
    for s, doc in zip(out, docs, strict=True):
        _check_fields(s)
        assert_same_tokens(doc, s.tokens, s.loss_mask, s.rollout_log_probs)
        assert s.reward == doc["reward"] == 0.5  # the task's verifier, run on the frozen workspace
        assert s.status.value == doc["status"] and s.rollout_id == 9
        assert s.metadata["rlgw"]["termination_reason"] == doc["metadata"]["termination_reason"]
