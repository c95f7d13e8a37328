"""The built-in agentic task: call a tool, read its result, answer with what only the result says.

Each attempt is one gateway session with two chat turns (the `openai` SDK, `tools=[locate]`):
1. "Where is the parcel? ..." -> the model calls `locate` (or answers at once);
2. if it called, the agent runs the tool (its result: a city drawn at random for this attempt,
   "Cairo") and sends it as a `tool` message (mask 0 in the sample) -> the model answers.
The verifier pays 1 when the model called `locate` and its answer is the tool's city, else 0: a
model that answers without calling, or ignores the result, is right by chance only (1 in 8). A GRPO
group is `group_size` attempts with one city (`group_cities`); each iteration's groups take the
cities in turn.

The task's fixture is `tests/fixtures/tiny-reader`, pretrained to copy a value (these cities among them) out
of a user message or another tool's result, never `locate`'s. `warm_start` first teaches the task's turns by
`WARM_STEPS` supervised steps (call `locate`; after its result, answer with a city drawn independently of
it), so iteration 0 names the result's city by chance (about 1 in 8): what RL must then learn is to read the
result in this task. Sampling is unconstrained, so the trainer's logprobs are the engine's on every token.
This module owns the task, its reward and its warm start, not the recording (the gateway's) or training.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlgw.trainer.rollouts import Attempt, CollectResult, run_attempts

# Cities that are one token in the fixtures' tokenizers: a constrained answer is one sampled choice.
CITIES = ("Athens", "Berlin", "Boston", "Cairo", "Delhi", "Dubai", "Dublin", "Geneva")
TOOL = {
    "type": "function",
    "function": {
        "name": "locate",
        "description": "Where the parcel is now.",
        "parameters": {"type": "object", "properties": {}},
    },
}
PROMPT = "Where is the parcel now? Call locate to find out, then answer with the city only."


def tool_reward(called: bool, answer: str | None, city: str) -> float:
    """1.0 if the model called the tool and the answer's first word is the tool's city, else 0.0."""
    if not called or not answer:
        return 0.0
    m = re.match(r"\W*(\w+)", answer)
    return 1.0 if m is not None and m.group(1) == city else 0.0


def group_cities(rng: random.Random, groups: int) -> list[str]:
    """The tool's city for each GRPO group of an iteration: the cities in turn, shuffled.

    A group is its attempts at one task, so one city for the whole group: an attempt is compared
    only with attempts that read the same result. Groups of mixed cities pushed a wrong answer
    down against other cities' successes, the same token in every context, and two cities that
    started weak were pushed out for good (seeds 0 and 1 stuck at 6/8 and 7/8). Taking the cities
    in turn trains every city alike each iteration.
    """
    cities = [CITIES[g % len(CITIES)] for g in range(groups)]
    rng.shuffle(cities)
    return cities


def warm_start_pairs(rng: random.Random, episodes: int) -> list[tuple[str, str]]:
    """(tool result, answer) of one warm-start step's episodes: each city answers equally often, and
    the results are shuffled apart from the answers, so the format is taught and not the reading,
    and no city ends the warm start favoured (answers drawn at random left, after the last steps'
    draws, two cities at p < 0.1 whatever the result, and RL at seed 0 never found them)."""
    answers = [CITIES[k % len(CITIES)] for k in range(episodes)]
    results = answers[:]
    rng.shuffle(answers)
    rng.shuffle(results)
    return list(zip(results, answers, strict=True))


@dataclass(slots=True)
class ToolRollouts:
    """`groups` GRPO groups of `group_size` attempts per iteration, each attempt a two-turn tool session."""

    groups: int = 4
    group_size: int = 8
    temperature: float = 1.0
    concurrency: int = 16
    seed: int = 0
    chat_template_kwargs: dict[str, Any] = field(default_factory=lambda: {"enable_thinking": False})

    async def collect(self, gateway_url: str, gateway_key: str | None, iteration: int) -> CollectResult:
        """Run every attempt of this iteration; each session is finished with its verified reward."""
        cities = group_cities(random.Random(self.seed * 1_000_003 + iteration), self.groups)
        attempts = [
            Attempt(
                "tool-locate",
                f"it{iteration}-g{g}-a{k}",
                iteration * self.groups + g,
                {"iteration": iteration, "city": city},
                functools.partial(self._episode, city=city),
            )
            for g, city in enumerate(cities)
            for k in range(self.group_size)
        ]
        sampling = {"temperature": self.temperature, "top_p": 1.0, "top_k": -1}
        return await run_attempts(gateway_url, gateway_key, attempts, sampling, self.concurrency, self.seed)

    async def _episode(self, agent: Any, city: str) -> float:
        messages: list[dict[str, Any]] = [{"role": "user", "content": PROMPT}]
        extra = {"chat_template_kwargs": self.chat_template_kwargs}
        first = await agent.chat.completions.create(
            model="policy", messages=messages, tools=[TOOL], max_tokens=24, extra_body=extra
        )
        msg = first.choices[0].message
        calls = [c for c in msg.tool_calls or [] if c.function.name == "locate"]
        if not calls:
            return tool_reward(False, msg.content, city)
        messages.append(msg.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": city})
        second = await agent.chat.completions.create(
            model="policy", messages=messages, tools=[TOOL], max_tokens=4, extra_body=extra
        )
        return tool_reward(True, second.choices[0].message.content, city)


# Enough steps that RL keeps the call format: after 15 (RL at lr 1.5e-3), seed 0 lost it at iteration 5 and
# every later session went unpaid. The answer drawn apart from the result still leaves iteration 0 at chance.
WARM_STEPS = 40


def _warm_start_rows(tokenizer: Any, result: str, answer: str) -> list[tuple[list[int], int]]:
    """One (ids, completion start) per turn of a made-up episode, rendered as the gateway renders it."""
    kw = {"tools": [TOOL], "add_generation_prompt": True, "enable_thinking": False, "tokenize": False}
    call = '<tool_call>\n{"name": "locate", "arguments": {}}\n</tool_call>'
    user = [{"role": "user", "content": PROMPT}]
    called = [*user, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "locate", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": result}]  # fmt: skip
    rows = []
    for messages, completion in ((user, call), (called, answer)):
        prompt = tokenizer.encode(tokenizer.apply_chat_template(messages, **kw), add_special_tokens=False)
        target = tokenizer.encode(completion + "<|im_end|>", add_special_tokens=False)
        rows.append((prompt + target, len(prompt)))
    return rows


def warm_start(
    src: Path, dst: Path, *, steps: int = WARM_STEPS, batch: int = 16, lr: float = 2e-3, seed: int = 0
) -> Path:
    """Copy the checkpoint at `src` to `dst`, taught the task's format by `steps` supervised steps."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        pairs = warm_start_pairs(rng, batch // 2)
        rows = [row for result, answer in pairs for row in _warm_start_rows(tokenizer, result, answer)]
        width = max(len(ids) for ids, _ in rows)
        ids = torch.full((len(rows), width), int(tokenizer.pad_token_id or 0))
        labels = torch.full((len(rows), width), -100)
        for i, (row, start) in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            labels[i, start : len(row)] = torch.tensor(row[start:])
        loss = model(input_ids=ids, labels=labels).loss  # right padding: causal, and never a label
        opt.zero_grad()
        loss.backward()
        opt.step()
    shutil.copytree(src, dst, dirs_exist_ok=True)
    model.save_pretrained(dst)
    return dst


def main() -> None:
    """`python -m rlgw.trainer.tool_task SRC DST`: write the warm-started checkpoint the config trains."""
    import argparse

    p = argparse.ArgumentParser(description="warm-start a checkpoint for trainer/configs/tool-tiny.json")
    p.add_argument("src", type=Path, help="a HF checkpoint directory (e.g. tests/fixtures/tiny-reader)")
    p.add_argument("dst", type=Path, help="where to write the warm-started copy (e.g. rlgw-tool-model)")
    p.add_argument("--steps", type=int, default=WARM_STEPS)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    print(f"wrote {warm_start(args.src, args.dst, steps=args.steps, lr=args.lr, seed=args.seed)}")


if __name__ == "__main__":
    main()
