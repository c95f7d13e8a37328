"""Many tasks at once: an asyncio pool locally, Ray tasks on a cluster, and the summary table.

`RunSpec` is a picklable recipe for an `InstalledAgent` (scaffold name and options, sandbox
spec, gateway address, run config) so each Ray worker builds its own. Both pools return
`RunResult`s in task order and show a progress bar. This module owns fan-out and reporting;
the per-task lifecycle is `agent.InstalledAgent`'s.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from rlgw.sandboxes.factory import SandboxSpec
from rlgw.scaffolds.agent import AgentConfig, InstalledAgent, RunResult
from rlgw.scaffolds.registry import build_scaffold
from rlgw.scaffolds.tasks import Task
from rlgw.scaffolds.termination import failure_classes


@dataclass(frozen=True, slots=True)
class RunSpec:
    """How to build the agent that runs each task (picklable)."""

    scaffold: str
    config: AgentConfig
    sandbox: SandboxSpec = field(default_factory=SandboxSpec)
    scaffold_options: dict[str, Any] = field(default_factory=dict)
    gateway_url: str | None = None
    gateway_key: str | None = None


async def run_local(spec: RunSpec, tasks: Sequence[Task], *, concurrency: int, progress: bool = True,
                    group_index: int = 0) -> list[RunResult]:  # fmt: skip
    """Run every task with at most `concurrency` at a time in this event loop."""
    from rlgw.gateway.trajectories.client import GatewayClient

    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    gateway = GatewayClient(spec.gateway_url, spec.gateway_key) if spec.gateway_url else None
    try:
        agent = InstalledAgent(build_scaffold(spec.scaffold, spec.scaffold_options), spec.sandbox.create,
                               gateway, spec.config)  # fmt: skip
        gate = asyncio.Semaphore(concurrency)
        bar = tqdm(
            total=len(tasks), desc=f"{spec.scaffold} {spec.config.mode}", unit="task", disable=not progress
        )

        async def one(task: Task) -> RunResult:
            async with gate:
                result = await agent.run(task, group_index=group_index)
            bar.update(1)
            bar.set_postfix_str(str(result.termination))
            return result

        try:
            return list(await asyncio.gather(*(one(t) for t in tasks)))
        finally:
            bar.close()
    finally:
        if gateway is not None:
            await gateway.aclose()


def _run_one_remote(spec: RunSpec, task_doc: dict[str, Any], group_index: int) -> dict[str, Any]:
    """Body of one Ray task: build the agent in the worker and run one task."""
    results = asyncio.run(run_local(spec, [Task.from_dict(task_doc)], concurrency=1, progress=False,
                                    group_index=group_index))  # fmt: skip
    return results[0].to_dict()


def run_ray(spec: RunSpec, tasks: Sequence[Task], *, address: str, concurrency: int, progress: bool = True,
            group_index: int = 0) -> list[RunResult]:  # fmt: skip
    """Fan the tasks out as Ray tasks (at most `concurrency` in flight) on the cluster at `address`.

    `address` is a Ray address (`ray://host:10001`, `auto`) or `local` to start a local Ray.
    """
    import ray

    if not ray.is_initialized():
        if address == "local":
            ray.init(include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    remote = ray.remote(num_cpus=0.5)(_run_one_remote)
    pending: dict[Any, int] = {}
    results: list[RunResult | None] = [None] * len(tasks)
    queue = list(enumerate(tasks))
    with tqdm(total=len(tasks), desc=f"{spec.scaffold} {spec.config.mode} (ray)", unit="task",
              disable=not progress) as bar:  # fmt: skip
        while queue or pending:
            while queue and len(pending) < concurrency:
                i, task = queue.pop(0)
                pending[remote.remote(spec, task.to_dict(), group_index)] = i
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                result = RunResult.from_dict(ray.get(ref))
                results[pending.pop(ref)] = result
                bar.update(1)
                bar.set_postfix_str(str(result.termination))
    return [r for r in results if r is not None]


def summarize(results: Sequence[RunResult]) -> dict[str, Any]:
    """Aggregate figures: rewards, termination classes, statuses, failed stages, trainable tokens."""
    rewards = [r.reward for r in results if r.reward is not None]
    return {
        "tasks": len(results),
        "graded": len(rewards),
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "solved": sum(1 for x in rewards if x >= 1.0),
        "termination": failure_classes(r.termination for r in results if r.termination is not None),
        "status": dict(Counter(r.status for r in results if r.status)),
        "failed_stages": dict(Counter(r.failed_stage for r in results if r.failed_stage)),
        "trainable_tokens": sum(r.trainable_tokens for r in results),
        "samples": sum(len(r.samples) for r in results),
        "rejects": sum(len(r.rejects) for r in results),
        "mean_turns": sum(r.turns for r in results) / len(results) if results else 0.0,
        "mean_duration_s": sum(r.duration_s for r in results) / len(results) if results else 0.0,
    }


def format_summary(results: Sequence[RunResult]) -> str:
    """A plain-text table: one line per task, then the totals and the failure classes."""
    s = summarize(results)
    head = (
        f"{'task':<24} {'reward':>7} {'termination':<24} {'status':<10} "
        f"{'turns':>5} {'tokens':>7} {'secs':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        reward = "-" if r.reward is None else f"{r.reward:.2f}"
        lines.append(
            f"{r.task_id[:24]:<24} {reward:>7} {r.termination!s:<24} {r.status or '-':<10} "
            f"{r.turns:>5} {r.trainable_tokens:>7} {r.duration_s:>6.1f}"
        )
    lines.append("-" * len(head))
    mean = "-" if s["mean_reward"] is None else f"{s['mean_reward']:.3f}"
    lines.append(
        f"tasks {s['tasks']}  graded {s['graded']}  solved {s['solved']}  mean reward {mean}  "
        f"samples {s['samples']}  rejects {s['rejects']}  trainable tokens {s['trainable_tokens']}  "
        f"mean turns {s['mean_turns']:.1f}  mean {s['mean_duration_s']:.1f}s/task"
    )
    lines.append("termination: " + ", ".join(f"{k} {v}" for k, v in s["termination"].items()))
    lines.append("status: " + ", ".join(f"{k} {v}" for k, v in s["status"].items()))
    if s["failed_stages"]:
        lines.append("failed stages: " + ", ".join(f"{k} {v}" for k, v in s["failed_stages"].items()))
    return "\n".join(lines)
