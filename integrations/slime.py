"""slime: a `--custom-generate-function-path` generate function and a reward post-process for rlgw runs.

Written against THUDM/slime at commit 624b824a898ab0ec1fcb4d373004c7f3852bf515 (2026-08-21), read
from its source (the seed pinned 681b3adc, whose `Sample` and hook call sites are the same):
- `slime/utils/types.py`: `Sample` (a dataclass; `rollout_id: int | None`, `tokens: list[int]`,
  `response_length`, `loss_mask: list[int] | None`, `rollout_log_probs: list[float] | None`,
  `reward`, `weight_versions: list[str]`, `metadata: dict`, `session_id`, ...) and
  `Sample.Status` (pending, completed, truncated, aborted, failed);
- `slime/rollout/sglang_rollout.py` `generate_and_rm`: the hook is awaited as
  `custom_generate(args, sample, sampling_params[, evaluation=...])` and may return a `Sample` or
  a `list[Sample]`; a list with any ABORTED sample skips the reward model, and samples whose
  `reward` is set keep it;
- `slime/ray/rollout.py` `_post_process_rewards`: `--custom-reward-post-process-path` is called as
  `func(args, samples)` on the flattened samples and returns `(raw_rewards, rewards)`; the default
  reshapes the rewards to `(-1, n_samples_per_prompt)` only when the count matches, so a rollout
  that forked into several samples breaks its groups; `_convert_samples_to_train_data` sums each
  `rollout_id`'s loss masks into `rollout_mask_sums`, the per-rollout denominator that
  `cp_utils.get_sum_of_sample_mean` divides by: siblings must share `rollout_id` (and
  `observability/rollout_data_utils.validate_rollout_id_annotated` asserts it).

`generate` runs the sample's task through an rlgw capture session (`rollout.run_rollout`) and returns
one slime `Sample` per stored segment or conversation, each a copy of slime's own sample with the
stored fields set: `tokens`, `response_length`, `loss_mask`, `rollout_log_probs`, `reward` (the
verifier's, the same on every sibling: the per-rollout denominator already weighs siblings as one
rollout, so it is not divided by their count), `status` (same value in slime's enum),
`rollout_id` (slime's int: the sample's own, else its index), `weight_versions` and `metadata["rlgw"]`,
and for a MoE model `rollout_routed_experts` (slime's routing-replay field: int32
[len(tokens) - 1, layers, top_k], as slime decodes SGLang's `routed_experts`).
A failed run returns the sample ABORTED with the reason in `metadata["rlgw_abort_reason"]`.
`reward_post_process` normalizes GRPO rewards per `group_index` with one value per rollout.
Settings come from `rlgw_*` attributes of slime's args (`--custom-config-path` YAML), else `RLGW_*`
(`settings.RlgwSettings`). This module never imports slime: the enum comes from the sample handed in.
"""

from __future__ import annotations

import copy
import math
import uuid
from collections import defaultdict
from typing import Any

from rlgw.integrations.rollout import (
    Rollout,
    TaskRequest,
    provenance,
    run_rollout,
    session_sampling,
    shared_client,
)
from rlgw.integrations.settings import RlgwSettings

# slime's estimators whose default post-process normalizes rewards per group (slime/ray/rollout.py).
GROUP_NORMALIZED = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
STD_NORMALIZED = ("grpo", "gspo", "cispo")


def settings_from_args(args: Any) -> RlgwSettings:
    """`RlgwSettings` from `args.rlgw_gateway_url`, `args.rlgw_runner`, ... (then `RLGW_*`)."""
    return RlgwSettings.from_mapping(lambda name: getattr(args, f"rlgw_{name}", None))


def task_request(sample: Any, sampling_params: dict[str, Any], *, evaluation: bool = False) -> TaskRequest:
    """The rlgw run for one slime sample: its prompt, its group, and `metadata["rlgw_task"]` if any."""
    meta = dict(sample.metadata or {})
    task = meta.pop("rlgw_task", None)
    task_id = (task or {}).get("id") or meta.get("task_id") or f"slime-{sample.index}"
    return TaskRequest(
        task_id=str(task_id),
        # slime gives each sample of a group its own session_id (generate_and_rm_group)
        rollout_id=sample.session_id or uuid.uuid4().hex,
        prompt=sample.prompt,
        group_index=sample.group_index or 0,
        sampling=session_sampling(sampling_params),
        metadata={"slime_index": sample.index, "evaluation": evaluation},
        task=task,
    )


def to_slime_samples(sample: Any, rollout: Rollout) -> list[Any]:
    """One copy of slime's `sample` per stored segment (or one ABORTED copy if the run failed)."""
    status = type(sample).Status
    rollout_id = sample.rollout_id if sample.rollout_id is not None else sample.index
    if not rollout.ok:
        out = copy.copy(sample)
        out.metadata = {**(sample.metadata or {}), "rlgw_abort_reason": rollout.error}
        out.status = status.ABORTED
        out.rollout_id = rollout_id
        return [out]
    samples = []
    for stored in rollout.samples:
        s = stored.sample
        out = copy.copy(sample)
        out.tokens = s.tokens.tolist()
        out.response_length = s.response_length
        out.loss_mask = s.loss_mask.tolist()
        out.rollout_log_probs = s.rollout_log_probs.tolist()
        out.reward = s.reward
        out.status = status(s.status.value)
        out.rollout_id = rollout_id
        out.weight_versions = [span.version for span in s.weight_versions]
        if s.rollout_routed_experts is not None:
            out.rollout_routed_experts = s.rollout_routed_experts.astype("int32")
        out.metadata = {
            **(sample.metadata or {}),
            "rlgw": {**provenance(stored), **s.metadata},
        }
        samples.append(out)
    return samples


async def generate(
    args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False
) -> list[Any]:
    """slime's custom generate function: run the sample's task through rlgw, return its samples."""
    settings = settings_from_args(args)
    gw = shared_client(settings.gateway_url, settings.gateway_key)
    request = task_request(sample, sampling_params, evaluation=evaluation)
    return to_slime_samples(sample, await run_rollout(gw, settings.build_runner(), request))


def reward_post_process(args: Any, samples: list[Any]) -> tuple[list[float], list[float]]:
    """`--custom-reward-post-process-path`: GRPO groups by `group_index`, one reward per rollout.

    slime's default normalizes over rows, so a rollout that forked into K samples would count K
    times in its group's mean and std (and the reshape assumes n_samples_per_prompt rows a
    group). Here each group's mean and (unbiased, as torch's) std are taken over its rollouts'
    rewards, and every sample of a rollout gets its rollout's normalized reward. With one sample
    per rollout this is slime's own arithmetic. Siblings with different rewards are an error.
    """
    reward_key = getattr(args, "reward_key", None)
    raw = [float(s.reward[reward_key] if reward_key else s.reward) for s in samples]
    estimator = getattr(args, "advantage_estimator", None)
    if estimator not in GROUP_NORMALIZED or not getattr(args, "rewards_normalization", False):
        return raw, list(raw)
    per_rollout: dict[Any, dict[Any, float]] = defaultdict(dict)
    for s, r in zip(samples, raw, strict=True):
        rid = s.rollout_id if s.rollout_id is not None else s.index
        seen = per_rollout[s.group_index].setdefault(rid, r)
        if seen != r:
            raise ValueError(
                f"rollout {rid} of group {s.group_index} has samples with rewards {seen} and {r}"
            )
    std_norm = estimator in STD_NORMALIZED and getattr(args, "grpo_std_normalization", False)
    normalized: dict[tuple[Any, Any], float] = {}
    for group, rewards in per_rollout.items():
        values = list(rewards.values())
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
        for rid, v in rewards.items():
            normalized[(group, rid)] = (v - mean) / (std + 1e-6) if std_norm else v - mean
    out = [
        normalized[(s.group_index, s.rollout_id if s.rollout_id is not None else s.index)] for s in samples
    ]
    return raw, out
