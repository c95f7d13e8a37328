"""verl: an agent loop that runs each prompt through an rlgw capture session (verl 0.9.x).

Written against `verl` 0.9.1 from PyPI, `verl.experimental.agent_loop.agent_loop`:
- `AgentLoopBase.__init__(trainer_config, server_manager, tokenizer, processor, dataset_cls,
  data_config, hf_model_type=None, **kwargs)`, instantiated by hydra from the registry entry, so
  the extra keys of an `agent_loop_config_path` entry (`gateway_url`, `runner`, ...) arrive as
  keyword arguments;
- `async run(sampling_params, **kwargs)`, kwargs being the dataset row (`raw_prompt`, `index`,
  `extra_info`, and in the v1 trainer `uid` and `session_id`);
- `AgentLoopOutput(prompt_ids, response_ids, response_mask, response_logprobs, reward_score,
  num_turns, metrics: AgentLoopMetrics, extra_fields)`. The classic `AgentLoopWorker` takes one
  output per run; the v1 trainer's worker (`verl/trainer/ppo/v1/agent_loop_tq.py`) takes
  `list[AgentLoopOutput]`, copies the last output's reward to the others, and
  `compute_advantage_for_multi_trajectories` computes GRPO from each session's last output and
  broadcasts it to its other outputs: the shape of an rlgw run with several segments.

`RlgwAgentLoop` (registered as `rlgw`) returns one `AgentLoopOutput` per stored segment or
conversation, for the v1 trainer; `RlgwSingleAgentLoop` (`rlgw_single`) returns the one output
the classic worker takes and raises if the run stored several (it has no row for them). Each is a
copy of the stored sample: `prompt_ids` = tokens before the response, `response_ids` = the
response region, `response_mask` = its loss mask, `response_logprobs` = its rollout logprobs,
`reward_score` = the run's verifier reward (verl then scores nothing again), rlgw's ids in
`extra_fields["rlgw"]`, and for a MoE model `routed_experts` (verl's router-replay field, "for the
total tokens": the stored [len(tokens) - 1, layers, top_k] ids; the last token is never fed forward).
A failed run raises `RolloutFailed` (verl has no status for it). verl's
SGLang servers are rlgw's engine: `rlgw serve --engine-url` points at them (through an
sglang-router). This module owns that conversion and nothing of verl's scheduling.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from rlgw.integrations.rollout import (
    Rollout,
    TaskRequest,
    provenance,
    run_rollout,
    session_sampling,
    shared_client,
)
from rlgw.integrations.settings import RlgwSettings

SETTINGS_KEYS = ("gateway_url", "gateway_key", "runner", "scaffold_options", "max_turns", "reward")


def task_request(sampling_params: dict[str, Any], kwargs: dict[str, Any]) -> TaskRequest:
    """The rlgw run for one verl dataset row (`raw_prompt`, `index`, `extra_info`, `uid`, `session_id`)."""
    extra = dict(kwargs.get("extra_info") or {})
    task = extra.get("rlgw_task")
    index = kwargs.get("index", extra.get("index"))
    task_id = (task or {}).get("id") or extra.get("task_id") or f"verl-{index}"
    try:
        group_index = int(index) if index is not None else 0
    except (TypeError, ValueError):
        group_index = 0
    session = kwargs.get("session_id")
    raw = kwargs.get("raw_prompt")  # a list or a numpy array of message dicts
    prompt = [dict(m) for m in raw] if raw is not None and len(raw) else str(extra.get("prompt", ""))
    return TaskRequest(
        task_id=str(task_id),
        rollout_id=f"verl-{kwargs.get('uid', index)}-{session if session is not None else uuid.uuid4().hex}",
        prompt=prompt,
        group_index=group_index,
        sampling=session_sampling(sampling_params),
        metadata={"verl_uid": None if kwargs.get("uid") is None else str(kwargs["uid"]), "verl_index": index},
        task=task,
    )


def to_agent_loop_outputs(rollout: Rollout, seconds: float = 0.0) -> list[AgentLoopOutput]:
    """One `AgentLoopOutput` per stored sample of a successful run (`RolloutFailed` otherwise)."""
    rollout.raise_for_failure()
    outputs = []
    for stored in rollout.samples:
        s = stored.sample
        p = s.prompt_length
        outputs.append(
            AgentLoopOutput(
                prompt_ids=s.tokens[:p].tolist(),
                response_ids=s.tokens[p:].tolist(),
                response_mask=s.loss_mask.tolist(),
                response_logprobs=s.rollout_log_probs.tolist(),
                routed_experts=s.rollout_routed_experts,
                reward_score=rollout.reward,
                num_turns=len(s.metadata.get("engine_rids") or []),
                metrics=AgentLoopMetrics(generate_sequences=seconds),
                extra_fields={
                    # the v1 worker copies the last output's reward_extra_info to the others
                    "reward_extra_info": {},
                    "rlgw": provenance(stored),
                },
            )
        )
    return outputs


@register("rlgw")
class RlgwAgentLoop(AgentLoopBase):
    """Runs the row's task through rlgw and returns one `AgentLoopOutput` per stored segment (v1 trainer)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        given = {k: kwargs.pop(k) for k in SETTINGS_KEYS if k in kwargs}
        super().__init__(*args, **kwargs)
        self.settings = RlgwSettings.from_mapping(given)
        self.runner = self.settings.build_runner()

    async def run_rollout(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        """The stored samples of one run as verl outputs."""
        started = time.monotonic()
        gw = shared_client(self.settings.gateway_url, self.settings.gateway_key)
        rollout = await run_rollout(gw, self.runner, task_request(sampling_params, kwargs))
        return to_agent_loop_outputs(rollout, time.monotonic() - started)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:  # type: ignore[override]
        return await self.run_rollout(sampling_params, **kwargs)


@register("rlgw_single")
class RlgwSingleAgentLoop(RlgwAgentLoop):
    """For verl's classic worker, which takes one output per run: a run that stored several fails loudly."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:  # type: ignore[override]
        outputs = await self.run_rollout(sampling_params, **kwargs)
        if len(outputs) != 1:
            raise ValueError(
                f"the run stored {len(outputs)} segments and verl's classic agent loop worker takes one "
                "output per run: use the 'rlgw' agent loop with verl's v1 trainer"
            )
        return outputs[0]
