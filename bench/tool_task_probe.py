"""Why the tool task (trainer/tool_task.py) does or does not learn: two cheap measurements on a checkpoint.

    python bench/tool_task_probe.py CHECKPOINT                       # what the model does at each turn
    python bench/tool_task_probe.py CHECKPOINT --rl-steps 30 --lr 5e-3   # can RL teach it to read the result?

1. The first turn's probability of opening a tool call, and after `locate`'s result the probability that the
   answer is the result's city, per city (chance: 1/8): whether the model calls and whether it reads.
2. `--rl-steps N`: GRPO on the answer token alone (64 attempts in groups of 8, one AdamW step each, the
   second turn rendered exactly as the gateway renders it), printing the mean reward per step. It leaves out
   the first turn, the gateway and the engine, so it is an upper bound on how fast the loop can learn to read:
   no call tokens share the rollout's denominator, and every step is on-policy.
This script only reads the checkpoint; it writes nothing.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlgw.trainer.tool_task import CITIES, PROMPT, TOOL

TEMPLATE = {"tools": [TOOL], "add_generation_prompt": True, "enable_thinking": False, "tokenize": False}
USER = [{"role": "user", "content": PROMPT}]
CALL = {"id": "call_0", "type": "function", "function": {"name": "locate", "arguments": {}}}


def prompt_ids(tok: Any, messages: list[dict[str, Any]]) -> list[int]:
    """The prompt the gateway sends the engine for `messages` (the task's chat template settings)."""
    return tok.encode(tok.apply_chat_template(messages, **TEMPLATE), add_special_tokens=False)


def after_result(tok: Any, city: str) -> list[int]:
    """The second turn's prompt: the call was made and `locate` answered `city`."""
    called = {"role": "tool", "tool_call_id": "call_0", "content": city}
    return prompt_ids(tok, [*USER, {"role": "assistant", "content": "", "tool_calls": [CALL]}, called])


def city_ids(tok: Any) -> dict[str, int]:
    """Each city's one token (the task picks cities that are one token)."""
    ids = {c: tok.encode(c, add_special_tokens=False) for c in CITIES}
    assert all(len(v) == 1 for v in ids.values()), ids
    return {c: v[0] for c, v in ids.items()}


@torch.no_grad()
def behaviour(model: Any, tok: Any) -> None:
    """Print p(call) at the first turn and p(answer == result) after each city."""
    first = torch.softmax(model(input_ids=torch.tensor([prompt_ids(tok, USER)])).logits[0, -1], -1)
    ids = city_ids(tok)
    print(f"first turn: p(<tool_call>) {float(first[tok.convert_tokens_to_ids('<tool_call>')]):.3f}, "
          f"p(a city at once) {float(sum(first[i] for i in ids.values())):.3f}")  # fmt: skip
    reads = []
    for c, i in ids.items():
        p = torch.softmax(model(input_ids=torch.tensor([after_result(tok, c)])).logits[0, -1], -1)
        reads.append(f"{c} {float(p[i]):.2f}")
    print("after the result, p(answer == its city): " + ", ".join(reads) + f" (chance {1 / len(CITIES):.3f})")


def rl(model: Any, tok: Any, steps: int, lr: float, seed: int) -> None:
    """GRPO on the answer token only; prints the mean reward and p(right city) per step."""
    ids = city_ids(tok)
    prompts = {c: after_result(tok, c) for c in CITIES}
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    rows = torch.arange(64)
    for step in range(steps):
        cities = [rng.choice(CITIES) for _ in range(64)]
        logits = model(input_ids=torch.tensor([prompts[c] for c in cities])).logits[:, -1].float()
        logp = torch.log_softmax(logits, -1)
        sampled = torch.distributions.Categorical(logits=logits).sample()
        right = torch.tensor([ids[c] for c in cities])
        reward = (sampled == right).float()
        groups = reward.view(8, 8)
        std = groups.std(dim=1, keepdim=True)
        adv = torch.where(std > 0, (groups - groups.mean(dim=1, keepdim=True)) / (std + 1e-6), 0.0).view(-1)
        loss = -(adv * logp[rows, sampled]).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        right_p = float(logp[rows, right].detach().exp().mean())
        print(f"step {step:3d}  reward {float(reward.mean()):.3f}  p(right) {right_p:.3f}", flush=True)


def main() -> None:
    """Parse the arguments and run the chosen measurements."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint", type=Path, help="a HF checkpoint (e.g. the tool task's warm start)")
    p.add_argument("--rl-steps", type=int, default=0, help="GRPO steps on the answer token (default: none)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(args.checkpoint)
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32)
    behaviour(model, tok)
    if args.rl_steps:
        rl(model, tok, args.rl_steps, args.lr, args.seed)


if __name__ == "__main__":
    main()
