"""Many tasks at once: an asyncio pool locally, Ray tasks on a cluster, and the summary table.

`RunSpec` is a picklable recipe for an `InstalledAgent` (scaffold name and options, sandbox
spec, gateway address, run config) so each Ray worker builds its own. Both pools return
`RunResult`s in task order and show a progress bar; on Ray a task lost with its worker or node
is retried, then reported as an `infra_error` result, never dropped. This module owns fan-out
and reporting; the per-task lifecycle is `agent.InstalledAgent`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from rlgw.sandboxes.factory import SandboxSpec
from rlgw.scaffolds.agent import RESULT_OUTPUT_CHARS, AgentConfig, InstalledAgent, RunResult
from rlgw.scaffolds.registry import build_scaffold
from rlgw.scaffolds.tasks import Task
from rlgw.scaffolds.termination import TerminationReason, failure_classes, status_for

log = logging.getLogger(__name__)


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
    async with _agent(spec) as agent:
        return await _fan_out(
            tasks, concurrency, f"{spec.scaffold} {spec.config.mode}", progress,
            lambda task: agent.run(task, group_index=group_index),
        )  # fmt: skip


# Each Ray task reserves half a CPU: an agent run mostly waits on the model, and its sandbox's
# commands are what use the node.
RAY_TASK_CPUS = 0.5


async def run_ray(
    spec: RunSpec,
    tasks: Sequence[Task],
    *,
    address: str,
    concurrency: int,
    progress: bool = True,
    group_index: int = 0,
    retries: int = 1,
) -> list[RunResult]:
    """Fan the tasks out as Ray tasks (at most `concurrency` in flight), spread over the cluster's nodes.

    `address` is a Ray address (`ray://host:10001`, `host:6379`, `auto`) or `local` to start a local Ray;
    every node needs rlgw installed. A task whose worker process or node dies is run again up to
    `retries` times (same rollout id; the dead attempt's session is never finished, so it stores
    nothing and the gateway drops it when idle); past that, or if the task itself raised, its result
    is an `infra_error` with `failed_stage` "ray" and Ray's error, in its place like any other.
    """
    try:
        import ray
    except ModuleNotFoundError as e:
        raise ValueError("running on Ray needs the `ray` package: pip install 'rlgw[ray]'") from e

    async with _agent(spec):  # a bad scaffold, option or mode fails here, once, as it does locally
        pass
    if not ray.is_initialized():
        if address == "local":
            ray.init(include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    remote = ray.remote(num_cpus=RAY_TASK_CPUS, max_retries=retries, scheduling_strategy="SPREAD")(
        _run_one_remote
    )

    async def one(task: Task) -> RunResult:
        rollout_id = uuid.uuid4().hex
        try:
            return RunResult.from_dict(await remote.remote(spec, task.to_dict(), group_index, rollout_id))
        except ray.exceptions.RayError as e:  # the worker or node died past its retries, or the task raised
            log.warning("ray task lost", extra={"fields": {"task": task.id, "error": str(e)[:2000]}})
            termination = TerminationReason.INFRA_ERROR
            return RunResult(
                task_id=task.id, mode=spec.config.mode, rollout_id=rollout_id, termination=termination,
                status=str(status_for(termination)), failed_stage="ray",
                error=f"{type(e).__name__}: {e}"[:RESULT_OUTPUT_CHARS],
            )  # fmt: skip

    return await _fan_out(tasks, concurrency, f"{spec.scaffold} {spec.config.mode} (ray)", progress, one)


def _run_one_remote(spec: RunSpec, task_doc: dict[str, Any], group_index: int,
                    rollout_id: str) -> dict[str, Any]:  # fmt: skip
    """Body of one Ray task: build the agent in the worker, run one task, say which node ran it."""
    import ray

    async def go() -> RunResult:
        async with _agent(spec) as agent:
            return await agent.run(Task.from_dict(task_doc), rollout_id=rollout_id, group_index=group_index)

    result = asyncio.run(go())
    result.node = ray.get_runtime_context().get_node_id()
    return result.to_dict()


@contextlib.asynccontextmanager
async def _agent(spec: RunSpec) -> AsyncIterator[InstalledAgent]:
    """The agent `spec` describes, with its gateway client open for the block."""
    from rlgw.gateway.trajectories.client import GatewayClient

    gateway = GatewayClient(spec.gateway_url, spec.gateway_key) if spec.gateway_url else None
    try:
        yield InstalledAgent(build_scaffold(spec.scaffold, spec.scaffold_options), spec.sandbox.create,
                             gateway, spec.config)  # fmt: skip
    finally:
        if gateway is not None:
            await gateway.aclose()


async def _fan_out(tasks: Sequence[Task], concurrency: int, desc: str, progress: bool,
                   run: Callable[[Task], Awaitable[RunResult]]) -> list[RunResult]:  # fmt: skip
    """`run` every task, at most `concurrency` at once, with a progress bar; results in task order."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    gate = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(tasks), desc=desc, unit="task", disable=not progress)

    async def one(task: Task) -> RunResult:
        async with gate:
            result = await run(task)
        bar.update(1)
        bar.set_postfix_str(str(result.termination))
        return result

    try:
        return list(await asyncio.gather(*(one(t) for t in tasks)))
    finally:
        bar.close()


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
