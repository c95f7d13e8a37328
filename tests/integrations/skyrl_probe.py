"""Runs inside SkyRL's own venv (Python 3.12): `RlgwGenerator` through SkyRL's real types, then a loss step.

`python -m tests.integrations.skyrl_probe GATEWAY_URL MODEL_DIR OUT_JSON` (repository root on
PYTHONPATH). One prompt group, two repetitions: the two-segment rewrite agent (reward 1) and a
one-segment agent (reward 0), step-wise. The rows go through SkyRL's own batching
(`convert_prompts_responses_to_batch_tensors`), its GRPO estimator on each trajectory's last row
broadcast to the earlier rows (the trainer's step-wise lines, `trainer.py` 738-768, restated here
on SkyRL's `compute_advantages_and_returns`), and its `regular` PPO policy loss (token_mean) with the
tiny model's log-probs, backward included. A non-step-wise generator must refuse the forked run.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from skyrl_train.dataset.preprocess import convert_prompts_responses_to_batch_tensors
from skyrl_train.generators.base import BatchMetadata, GeneratorInput, GeneratorInterface, TrajectoryID
from skyrl_train.utils.ppo_utils import PolicyLossRegistry, compute_advantages_and_returns
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlgw.integrations.skyrl import RlgwGenerator
from tests.support import fixture_prompts as fp

AGENTS = "tests.integrations.agents"


def batch(runner_rows: int) -> GeneratorInput:
    return GeneratorInput(
        prompts=[list(fp.WEATHER)] * runner_rows,
        env_classes=["rlgw"] * runner_rows,
        env_extras=[{"task_id": "weather"}] * runner_rows,
        sampling_params={"temperature": 0.0, "top_p": 1.0, "max_generate_length": 64},
        trajectory_ids=[TrajectoryID("weather", k) for k in range(runner_rows)],
        batch_metadata=BatchMetadata(global_step=1, training_phase="train"),
    )


async def generate(gateway: str) -> dict[str, Any]:
    forked = RlgwGenerator({"gateway_url": gateway, "runner": f"{AGENTS}:rewrite_agent"}, step_wise=True)
    plain = RlgwGenerator({"gateway_url": gateway, "runner": f"{AGENTS}:one_segment_agent"}, step_wise=True)
    assert isinstance(forked, GeneratorInterface)
    a = await forked.generate(batch(1))
    b_input = batch(2)
    b_input["prompts"], b_input["trajectory_ids"] = b_input["prompts"][1:], b_input["trajectory_ids"][1:]
    b_input["env_extras"] = b_input["env_extras"][1:]
    b = await plain.generate(b_input)
    merged = {k: (a[k] + b[k]) if isinstance(a[k], list) else a[k] for k in a}
    refused = None
    try:
        await RlgwGenerator({"gateway_url": gateway, "runner": f"{AGENTS}:rewrite_agent"}).generate(batch(1))
    except ValueError as exc:
        refused = str(exc)
    return {"output": merged, "refused": refused}


def main() -> None:
    gateway, model_dir, out_path = sys.argv[1:4]
    torch.manual_seed(0)
    got = asyncio.run(generate(gateway))
    out = got["output"]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    per_token = [[0.0] * (len(r) - 1) + [w] for r, w in zip(out["response_ids"], out["rewards"], strict=True)]
    sequences, attention, response_mask, rewards, loss_mask, logprobs = (
        convert_prompts_responses_to_batch_tensors(
            tokenizer,
            out["prompt_token_ids"],
            out["response_ids"],
            per_token,
            out["loss_masks"],
            out["rollout_logprobs"],
        )
    )

    # GRPO on each trajectory's last row, broadcast to its earlier rows (SkyRL's step-wise trainer path).
    is_last = torch.tensor(out["is_last_step"], dtype=torch.bool)
    uids = np.array([t.instance_id for t in out["trajectory_ids"]])
    algo = OmegaConf.create({"advantage_estimator": "grpo", "grpo_norm_by_std": True})
    last_adv, _ = compute_advantages_and_returns(
        token_level_rewards=rewards[is_last],
        response_mask=response_mask[is_last],
        index=uids[is_last.numpy()],
        adv_estimator="grpo",
        config=algo,
        grpo_norm_by_std=True,
    )
    traj = torch.cat([torch.tensor([False]), is_last[:-1]]).int().cumsum(dim=0)
    advantages = last_adv[traj]

    # One PPO policy loss with the tiny model (the engine's weights), over SkyRL's padded batch.
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    n = response_mask.shape[1]
    positions = (attention.long().cumsum(-1) - 1).clamp(min=0)  # prompts are left-padded
    logits = model(sequences, attention_mask=attention, position_ids=positions).logits[:, -n - 1 : -1]
    log_probs = torch.log_softmax(logits, dim=-1).gather(-1, sequences[:, -n:].unsqueeze(-1)).squeeze(-1)
    config = OmegaConf.create(
        {
            "policy_loss_type": "regular",
            "loss_reduction": "token_mean",
            "eps_clip_low": 0.2,
            "eps_clip_high": 0.2,
            "use_tis": False,
            "max_seq_len": None,
        }
    )
    policy_loss = PolicyLossRegistry.get("regular")
    loss, _ = policy_loss(log_probs, logprobs, advantages, config, loss_mask)
    loss.backward()
    junk = torch.where(loss_mask.bool(), log_probs.detach(), torch.full_like(log_probs, 50.0))
    loss_junk, _ = policy_loss(junk, logprobs, advantages, config, loss_mask)
    ratio = torch.exp(log_probs.detach() - logprobs)[loss_mask.bool()]
    report = {
        "output": {**out, "trajectory_ids": [t.to_string() for t in out["trajectory_ids"]]},
        "refused": got["refused"],
        "advantages": [float(advantages[i][loss_mask[i].bool()][0]) for i in range(len(advantages))],
        "batch": {"loss_mask": loss_mask.int().tolist(), "rollout_logprobs": logprobs.tolist()},
        "loss": {
            "value": loss.item(),
            "junk_value": loss_junk.item(),
            "grad_abs_sum": sum(float(p.grad.abs().sum()) for p in model.parameters() if p.grad is not None),
            "mask_tokens": int(loss_mask.sum()),
            "max_ratio_gap": float((ratio - 1).abs().max()),
            "manual_token_mean": float((-advantages)[loss_mask.bool()].mean()),
        },
    }
    with open(out_path, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
