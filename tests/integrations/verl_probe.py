"""Runs inside verl's own venv: rlgw's agent loops through verl's real classes, then a verl loss step on CPU.

`python -m tests.integrations.verl_probe GATEWAY_URL MODEL_DIR OUT_JSON` (repository root on
PYTHONPATH). It instantiates `RlgwAgentLoop` the way verl's `AgentLoopWorker._run_agent_loop`
does (hydra from the registry entry, `DictConfigWrap`, the real tokenizer), runs two rollouts of
one prompt group (the two-segment rewrite agent, reward 1, and a one-segment agent, reward 0),
computes verl's GRPO advantages with `compute_advantage_for_multi_trajectories` (when the v1
trainer's imports are installed), and one PPO policy loss (`compute_policy_loss_vanilla`,
token-mean) with the tiny model's log-probs, backward included. It writes what verl got as JSON
for the test (in rlgw's venv) to compare with the store.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import hydra
import numpy as np
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, AutoTokenizer
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.utils.torch_functional import logprobs_from_logits

import rlgw.integrations.verl as rlgw_verl
from tests.support import fixture_prompts as fp

SAMPLING = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


def make_loop(name: str, gateway: str, runner: str, tokenizer: Any) -> Any:
    """The agent loop as `AgentLoopWorker._run_agent_loop` builds it (registry entry + rlgw keys)."""
    cfg = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"prompt_length": 1024, "response_length": 1024}}, "data": {}}
    )
    entry = OmegaConf.create({**_agent_loop_registry[name], "gateway_url": gateway, "runner": runner})
    return hydra.utils.instantiate(
        config=entry,
        trainer_config=DictConfigWrap(config=cfg),
        server_manager=None,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type="qwen3",
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(cfg.data),
        tools=ToolListWrap([]),
    )


async def rollouts(gateway: str, tokenizer: Any) -> dict[str, list[AgentLoopOutput]]:
    row = {
        "raw_prompt": np.array(fp.WEATHER, dtype=object),
        "index": 3,
        "extra_info": {"task_id": "weather"},
        "uid": "u3",
        "agent_name": "rlgw",
    }
    a = make_loop("rlgw", gateway, "tests.integrations.agents:rewrite_agent", tokenizer)
    b = make_loop("rlgw", gateway, "tests.integrations.agents:one_segment_agent", tokenizer)
    single = make_loop("rlgw_single", gateway, "tests.integrations.agents:rewrite_agent", tokenizer)
    out = {
        "s0": await a.run(SAMPLING, **row, session_id="s0"),
        "s1": await b.run(SAMPLING, **row, session_id="s1"),
    }
    try:
        await single.run(SAMPLING, **row, session_id="s2")
        out["single_error"] = None  # type: ignore[assignment]
    except ValueError as exc:
        out["single_error"] = str(exc)  # type: ignore[assignment]
    return out


def padded(rows: list[torch.Tensor], value: float = 0.0) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=value)


def main() -> None:
    gateway, model_dir, out_path = sys.argv[1:4]
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    got = asyncio.run(rollouts(gateway, tokenizer))
    outputs = [*got["s0"], *got["s1"]]
    keys = [f"u3_s0_{i}" for i in range(len(got["s0"]))] + [f"u3_s1_{i}" for i in range(len(got["s1"]))]
    rows = [o.as_dict() for o in outputs]  # verl's own conversion to tensors

    mask = padded([r["response_mask"] for r in rows]).float()
    old = padded([r["rollout_log_probs"] for r in rows])
    rewards = padded([r["rm_scores"] for r in rows])
    report: dict[str, Any] = {
        "outputs": [
            {**o.model_dump(exclude={"metrics"}), "key": k} for o, k in zip(outputs, keys, strict=True)
        ],
        "single_error": got["single_error"],
        "registry": {k: dict(v) for k, v in _agent_loop_registry.items() if k.startswith("rlgw")},
        "module": rlgw_verl.__name__,
    }

    # GRPO over the group's two sessions, as verl's v1 trainer computes it (if its imports are here).
    try:
        from verl.protocol import DataProto
        from verl.trainer.ppo.core_algos import AdvantageEstimator
        from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

        data = DataProto.from_dict(
            tensors={"token_level_rewards": rewards, "response_mask": mask.long()},
            non_tensors={"uid": np.array(["u3"] * len(rows), dtype=object)},
        )
        data = compute_advantage_for_multi_trajectories(data, keys, AdvantageEstimator.GRPO)
        advantages = data.batch["advantages"]
        report["advantages"] = [float(advantages[i][mask[i].bool()][0]) for i in range(len(rows))]
    except ImportError as exc:
        report["advantages_skipped"] = str(exc)
        advantages = mask.clone()

    # One PPO policy-loss step with the tiny model (the engine's weights: the ratio is about 1).
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    seqs = [torch.cat([r["prompts"], r["responses"]]) for r in rows]
    log_prob = torch.zeros_like(old)
    for i, (seq, r) in enumerate(zip(seqs, rows, strict=True)):
        logits = model(seq.unsqueeze(0)).logits[0]
        p, n = r["prompts"].numel(), r["responses"].numel()
        log_prob[i, :n] = logprobs_from_logits(logits[p - 1 : p - 1 + n], r["responses"])
    config = OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": None,
            "clip_ratio_high": None,
            "clip_ratio_c": 3.0,
            "global_batch_info": {},
        }
    )
    loss, metrics = compute_policy_loss_vanilla(old, log_prob, advantages, mask, "token-mean", config)
    loss.backward()
    grad = sum(float(p.grad.abs().sum()) for p in model.parameters() if p.grad is not None)
    # The same loss with garbage log-probs on every mask-0 position (tool output, template, padding).
    junk = torch.where(mask.bool(), log_prob.detach(), torch.full_like(log_prob, 50.0))
    loss_junk, _ = compute_policy_loss_vanilla(old, junk, advantages, mask, "token-mean", config)
    ratio = torch.exp(log_prob.detach() - old)[mask.bool()]
    report["loss"] = {
        "value": loss.item(),
        "junk_value": loss_junk.item(),
        "grad_abs_sum": grad,
        "mask_tokens": int(mask.sum()),
        "max_ratio_gap": float((ratio - 1).abs().max()),
        "manual_token_mean": float((-advantages * ratio.new_ones(advantages.shape))[mask.bool()].mean()),
        "ppo_kl": metrics["actor/ppo_kl"],
    }
    with open(out_path, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
