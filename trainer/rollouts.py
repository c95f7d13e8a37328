"""Where a loop iteration's rollouts come from: agents working through real gateway sessions.

Two sources behind one small interface, each returning the cursors the gateway stored:
- `ChatRollouts`: a one-turn agent in this process (the `openai` SDK against the session's base
  URL) on prompts with a verifiable answer; fast, for small models and tests.
- `ScaffoldRollouts`: installed scaffolds (rlgw-mini, OpenHands, Terminus-2) on a tasks file,
  through `rlgw run`'s pool (`rlgw.scaffolds.pool`: in this process, or as Ray tasks on a
  cluster), graded by each task's verifier.
Each prompt is attempted `group_size` times; attempts share a `group_index` (a GRPO group).
This module owns fan-out and rewards of the chat tasks, not recording (the gateway's) or training.
"""

from __future__ import annotations

import asyncio
import functools
import random
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlgw.gateway.ids import derived_seed
from rlgw.gateway.trajectories.client import GatewayClient


@dataclass(slots=True)
class CollectResult:
    """What one iteration's rollouts produced: the stored cursors, rewards, rejects."""

    cursors: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    rejected_segments: int = 0
    failed_runs: int = 0

    @property
    def last_cursor(self) -> int | None:
        """The highest cursor stored by this iteration (None if nothing was stored)."""
        return max(self.cursors) if self.cursors else None


class RolloutSource(Protocol):
    """Runs one iteration's rollouts through the gateway at `gateway_url`."""

    async def collect(self, gateway_url: str, gateway_key: str | None, iteration: int) -> CollectResult: ...


@dataclass(frozen=True, slots=True)
class WordTask:
    """A prompt and the word the answer must start with."""

    prompt: str
    word: str


def first_word_reward(content: str | None, word: str) -> float:
    """1.0 if the reply's first word is `word` (case-sensitive, punctuation around it ignored), else 0.0."""
    if not content:
        return 0.0
    m = re.match(r"\W*(\w+)", content)
    return 1.0 if m is not None and m.group(1) == word else 0.0


Episode = Callable[[Any], Awaitable[float]]  # plays one attempt with the session's SDK client; its reward


@dataclass(frozen=True, slots=True)
class Attempt:
    """One session to run: its task, rollout and GRPO group, metadata, and the episode that plays it."""

    task_id: str
    rollout_id: str
    group_index: int
    metadata: dict[str, Any]
    episode: Episode


async def run_attempts(
    gateway_url: str,
    gateway_key: str | None,
    attempts: list[Attempt],
    sampling: dict[str, Any],
    concurrency: int,
    seed: int | None = None,
) -> CollectResult:
    """Run each attempt as one capture session (at most `concurrency` at once), finished with its reward.

    With `seed`, each session samples with its own seed derived from (`seed`, its rollout id), and the
    gateway seeds its turns from that: a run with the same seed samples the same tokens (on one engine
    build, as the engine's own seeding promises), and no two attempts share a random stream.
    An attempt whose episode raises is finished as `failed` with reward 0 and counted in `failed_runs`.
    """
    import openai

    gate = asyncio.Semaphore(concurrency)
    result = CollectResult()
    # One SDK client (one connection pool) for every attempt, each a copy with its session's
    # base URL and key: building a client per attempt took about 24 ms of the event loop
    # here (its HTTP client and TLS context), which delayed a whole wave of attempts.
    sdk = openai.AsyncOpenAI(base_url=gateway_url, api_key=gateway_key or "unused", max_retries=0)
    async with sdk, GatewayClient(gateway_url, gateway_key) as gw:

        async def run(a: Attempt) -> None:
            async with gate:
                seeded = sampling if seed is None else {**sampling, "seed": derived_seed(seed, a.rollout_id)}
                s = await gw.create_session(
                    a.task_id,
                    rollout_id=a.rollout_id,
                    group_index=a.group_index,
                    sampling=seeded,
                    metadata=a.metadata,
                )
                agent = sdk.with_options(base_url=s.base_url, api_key=s.api_key)
                try:
                    reward = await a.episode(agent)
                    summary = await gw.finish_session(s.session_id, reward=reward)
                except Exception:
                    result.failed_runs += 1
                    await gw.finish_session(s.session_id, reward=0.0, status="failed")
                    return
                result.rewards.append(reward)
                result.cursors += [x.cursor for x in summary.samples]
                result.rejected_segments += len(summary.rejects)

        await asyncio.gather(*(run(a) for a in attempts))
    return result


@dataclass(slots=True)
class ChatRollouts:
    """One-turn chats: `groups` prompts per iteration (drawn with `seed`), `group_size` attempts each."""

    tasks: list[WordTask]
    groups: int = 4
    group_size: int = 8
    max_tokens: int = 8
    temperature: float = 1.0
    concurrency: int = 16
    seed: int = 0
    chat_template_kwargs: dict[str, Any] = field(default_factory=lambda: {"enable_thinking": False})

    async def collect(self, gateway_url: str, gateway_key: str | None, iteration: int) -> CollectResult:
        """Run every attempt of this iteration's prompts; each is one session, finished with its reward."""
        rng = random.Random(self.seed * 1_000_003 + iteration)
        picks = [rng.choice(self.tasks) for _ in range(self.groups)]

        def episode(task: WordTask) -> Episode:
            async def play(agent: Any) -> float:
                reply = await agent.chat.completions.create(
                    model="policy",
                    messages=[{"role": "user", "content": task.prompt}],
                    max_tokens=self.max_tokens,
                    extra_body={"chat_template_kwargs": self.chat_template_kwargs},
                )
                return first_word_reward(reply.choices[0].message.content, task.word)

            return play

        attempts = [
            Attempt(
                f"word-{task.word}",
                f"it{iteration}-g{g}-a{k}",
                iteration * self.groups + g,
                {"iteration": iteration, "word": task.word},
                episode(task),
            )
            for g, task in enumerate(picks)
            for k in range(self.group_size)
        ]
        sampling = {"temperature": self.temperature, "top_p": 1.0, "top_k": -1}
        return await run_attempts(gateway_url, gateway_key, attempts, sampling, self.concurrency, self.seed)


@dataclass(slots=True)
class ScaffoldRollouts:
    """Installed scaffolds on a tasks file through `rlgw run`'s pool; `groups` tasks per iteration."""

    scaffold: str
    tasks_file: str
    groups: int = 2
    group_size: int = 4
    max_turns: int = 4
    concurrency: int = 4
    seed: int = 0
    scaffold_options: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] | None = None
    ray: str | None = None  # a Ray address: each run is a Ray task on that cluster (`rlgw.scaffolds.pool`)

    async def collect(self, gateway_url: str, gateway_key: str | None, iteration: int) -> CollectResult:
        """Run each picked task `group_size` times (one pool per group, groups side by side)."""
        import sys
        from pathlib import Path

        from rlgw.scaffolds.agent import AgentConfig
        from rlgw.scaffolds.pool import RunSpec, run_local, run_ray
        from rlgw.scaffolds.tasks import load_tasks

        tasks = load_tasks(Path(self.tasks_file))
        rng = random.Random(self.seed * 1_000_003 + iteration)
        picks = [rng.choice(tasks) for _ in range(self.groups)]
        options = dict(self.scaffold_options)
        if self.scaffold == "rlgw-mini":
            options.setdefault("python", sys.executable)  # the local sandbox shares this interpreter
        spec = RunSpec(
            scaffold=self.scaffold,
            scaffold_options=options,
            gateway_url=gateway_url,
            gateway_key=gateway_key,
            config=AgentConfig(
                mode="capture", model="policy", max_turns=self.max_turns, sampling=self.sampling
            ),
        )
        per_group = max(1, self.concurrency // max(1, self.groups))
        pool = run_local if self.ray is None else functools.partial(run_ray, address=self.ray)
        runs = await asyncio.gather(
            *(
                pool(
                    spec,
                    [task] * self.group_size,
                    concurrency=per_group,
                    progress=False,
                    group_index=iteration * self.groups + g,
                )
                for g, task in enumerate(picks)
            )
        )
        result = CollectResult()
        for r in (r for group in runs for r in group):
            if r.failed_stage:
                result.failed_runs += 1
            if r.reward is not None:
                result.rewards.append(r.reward)
            result.cursors += [s["cursor"] for s in r.samples]
            result.rejected_segments += len(r.rejects)
        return result
