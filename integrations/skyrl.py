"""SkyRL: a `GeneratorInterface` whose rollouts are rlgw capture sessions (`skyrl-train` 0.3.x, Python 3.12).

Written against `skyrl-train` 0.3.1 from PyPI, `skyrl_train/generators/base.py`:
`GeneratorInterface.generate(input_batch: GeneratorInput) -> GeneratorOutput`, where the input holds
`prompts` (chat messages), `env_extras`, `sampling_params`, `trajectory_ids`
(`TrajectoryID(instance_id, repetition_id)`) and `batch_metadata`, and the output (a TypedDict) holds
`prompt_token_ids`, `response_ids`, `rewards`, `loss_masks`, `stop_reasons`, `rollout_metrics`,
`rollout_logprobs`, `trajectory_ids` and `is_last_step`. `trainer.py` checks one output row per
prompt unless `generator.step_wise_trajectories` is on; then rows of one trajectory are consecutive,
the last marked `is_last_step`, its uid is the row's `trajectory_ids[i].instance_id`, and the
advantage computed on each trajectory's last row is broadcast to its earlier rows.

`RlgwGenerator` runs every prompt through an rlgw capture session and returns the stored samples:
one row per prompt, or with `step_wise=True` (SkyRL's `step_wise_trajectories`) one row per stored
segment or conversation, so a run that forked stays one trajectory in one GRPO group. Each row is a
copy of a stored sample: `prompt_token_ids` = the tokens before the response, `response_ids`, the
loss mask, the rollout logprobs, and the run's verifier reward. A run that stored several segments
without `step_wise`, or that failed, raises (SkyRL has no status to carry it). Settings are
`RlgwSettings` (a mapping, e.g. from the Hydra config). This module owns that conversion only.
A MoE sample's routed experts are not carried: 0.3.1's `GeneratorOutput` has no field for them, so
SkyRL trains a MoE without routing replay (slime's and verl's adapters carry them).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from skyrl_train.generators.base import GeneratorInput, GeneratorInterface, GeneratorOutput, TrajectoryID

from rlgw.integrations.rollout import Rollout, TaskRequest, run_rollout, session_sampling, shared_client
from rlgw.integrations.settings import RlgwSettings

# SkyRL's stop reasons are the engine's finish reasons; rlgw's statuses map onto them.
STOP_REASONS = {"completed": "stop", "truncated": "length"}


def task_requests(input_batch: GeneratorInput) -> tuple[list[TaskRequest], list[TrajectoryID]]:
    """One rlgw run per prompt, and the trajectory id each one answers to."""
    prompts = input_batch["prompts"]
    extras = input_batch.get("env_extras") or [{} for _ in prompts]
    ids = input_batch.get("trajectory_ids") or [TrajectoryID(uuid.uuid4().hex, 0) for _ in prompts]
    meta = input_batch.get("batch_metadata")
    step = f"{meta.training_phase}{meta.global_step}" if meta is not None else uuid.uuid4().hex[:8]
    sampling = session_sampling(input_batch.get("sampling_params"))
    groups: dict[str, int] = {}
    requests = []
    for prompt, extra, tid in zip(prompts, extras, ids, strict=True):
        extra = dict(extra or {})
        task = extra.get("rlgw_task")
        requests.append(
            TaskRequest(
                task_id=str((task or {}).get("id") or extra.get("task_id") or tid.instance_id),
                rollout_id=f"skyrl-{step}-{tid.to_string()}-{uuid.uuid4().hex[:8]}",
                prompt=[dict(m) for m in prompt],
                group_index=groups.setdefault(tid.instance_id, len(groups)),
                sampling=sampling,
                metadata={"skyrl_instance_id": tid.instance_id, "skyrl_repetition_id": tid.repetition_id},
                task=task,
            )
        )
    return requests, list(ids)


def to_generator_output(
    rollouts: Sequence[Rollout], trajectory_ids: Sequence[TrajectoryID], *, step_wise: bool
) -> GeneratorOutput:
    """The runs' stored samples as SkyRL rows (one per run, or one per segment when `step_wise`)."""
    out: dict[str, list[Any]] = {
        k: []
        for k in (
            "prompt_token_ids",
            "response_ids",
            "rewards",
            "loss_masks",
            "stop_reasons",
            "rollout_logprobs",
            "trajectory_ids",
            "is_last_step",
        )
    }
    for rollout, tid in zip(rollouts, trajectory_ids, strict=True):
        rollout.raise_for_failure()
        if not step_wise and len(rollout.samples) != 1:
            raise ValueError(
                f"rollout {rollout.request.rollout_id} stored {len(rollout.samples)} segments: SkyRL takes "
                "one row per prompt unless generator.step_wise_trajectories is on (and step_wise=True here)"
            )
        for k, stored in enumerate(rollout.samples):
            s = stored.sample
            p = s.prompt_length
            out["prompt_token_ids"].append(s.tokens[:p].tolist())
            out["response_ids"].append(s.tokens[p:].tolist())
            out["rewards"].append(float(rollout.reward or 0.0))
            out["loss_masks"].append(s.loss_mask.tolist())
            out["stop_reasons"].append(STOP_REASONS.get(str(s.status), str(s.status)))
            out["rollout_logprobs"].append(s.rollout_log_probs.tolist())
            out["trajectory_ids"].append(tid)
            out["is_last_step"].append(k == len(rollout.samples) - 1)
    rows = len(out["response_ids"])
    metrics = {
        "rlgw/rows_per_rollout": rows / max(1, len(rollouts)),
        "rlgw/trainable_tokens": sum(sum(m) for m in out["loss_masks"]),
    }
    return GeneratorOutput(
        prompt_token_ids=out["prompt_token_ids"],
        response_ids=out["response_ids"],
        rewards=out["rewards"],
        loss_masks=out["loss_masks"],
        stop_reasons=out["stop_reasons"],
        rollout_metrics=metrics,
        rollout_logprobs=out["rollout_logprobs"],
        trajectory_ids=out["trajectory_ids"],
        is_last_step=out["is_last_step"] if step_wise else None,
    )


class RlgwGenerator(GeneratorInterface):
    """SkyRL's generator over rlgw sessions: `RlgwGenerator({"gateway_url": ..., "runner": ...})`.

    SkyRL's inference engines are rlgw's engine: `rlgw serve --engine-url` points at them (SGLang
    servers, through an sglang-router). At most `max_concurrency` runs are in flight.
    """

    def __init__(
        self,
        settings: RlgwSettings | Mapping[str, Any],
        *,
        step_wise: bool = False,
        max_concurrency: int = 64,
    ) -> None:
        self.settings = (
            settings if isinstance(settings, RlgwSettings) else RlgwSettings.from_mapping(settings)
        )
        self.runner = self.settings.build_runner()
        self.step_wise = step_wise
        self.max_concurrency = max_concurrency

    async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:
        """Run every prompt through rlgw and return the stored samples, in input order."""
        requests, ids = task_requests(input_batch)
        gw = shared_client(self.settings.gateway_url, self.settings.gateway_key)
        gate = asyncio.Semaphore(self.max_concurrency)

        async def one(request: TaskRequest) -> Rollout:
            async with gate:
                return await run_rollout(gw, self.runner, request)

        rollouts = await asyncio.gather(*(one(r) for r in requests))
        return to_generator_output(rollouts, ids, step_wise=self.step_wise)
