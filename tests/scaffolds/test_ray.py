"""Rollouts as Ray tasks on a real two-node Ray cluster, against a real gateway and engine.

`ray.cluster_utils.Cluster` starts a head node and a second node on this machine (each its own
raylet and worker processes). rlgw-mini runs in local sandboxes inside the Ray workers and talks
to `rlgw serve` in front of the embedded engine (tiny Qwen3). Shown here: `rlgw run --ray ADDRESS`
spreads the tasks over both nodes (each result names its node), shows its progress line and
prints the results in task order; a worker SIGKILLed mid-task is retried (and the dead attempt
stores nothing), or, with no retries left, comes back as an `infra_error` in its place; the
trainer's scaffold rollouts run on the same cluster.

A task is caught "mid-task" by its verifier, which (on its first attempt only) writes the Ray
worker's pid (the shell's parent) and sleeps; the test kills that worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx
import orjson
import pytest

from rlgw.sandboxes.factory import SandboxSpec
from rlgw.scaffolds.agent import AgentConfig
from rlgw.scaffolds.pool import RunSpec, run_ray
from rlgw.scaffolds.tasks import Task, Verifier
from rlgw.scaffolds.termination import TerminationReason
from rlgw.trainer.rollouts import ScaffoldRollouts
from tests.support.procs import REPO

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[dev]' installs it)")

# About 3 minutes on 2 shared cores, half of it starting the cluster and the gateway.
pytestmark = pytest.mark.slow

MAX_TOKENS = 32  # the tiny model's replies are noise; short ones keep each run to a few seconds


def with_repo_on_path(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with this checkout first on PYTHONPATH."""
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)}


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, set[str]]]:
    """A two-node Ray cluster on this machine: its address and its node ids."""
    from ray.cluster_utils import Cluster

    # The raylets start the workers with this environment: they must import this tree's rlgw.
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = with_repo_on_path(os.environ)["PYTHONPATH"]
    try:
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
        c.add_node(num_cpus=2)
        c.wait_for_nodes()
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    try:
        yield c.address, {n.node_id for n in c.list_all_nodes()}
    finally:
        ray.shutdown()
        c.shutdown()


def task(task_id: str, verifier: str = "true") -> Task:
    return Task(
        task_id, "List the files here.", setup_files={"README.md": "notes\n"}, verifier=Verifier(verifier)
    )


def hang_once(marker: Path, seconds: int = 60) -> str:
    """A verifier that, on its first attempt only, records the worker's pid and its own group, then hangs."""
    return f"if mkdir {marker} 2>/dev/null; then echo $PPID $$ > {marker}/pids; sleep {seconds}; fi"


async def kill_worker_when_hung(marker: Path, run: asyncio.Task) -> int:
    """Wait for the first attempt to hang, SIGKILL its Ray worker; the worker's pid."""
    pids = marker / "pids"
    while True:
        if pids.exists() and pids.read_text().strip():
            break
        assert not run.done(), f"the run ended before its victim hung: {run.result()}"
        await asyncio.sleep(0.2)
    worker, group = (int(x) for x in pids.read_text().split())
    os.kill(worker, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):  # the orphaned `sleep` (no bubblewrap to reap it)
        os.killpg(group, signal.SIGKILL)
    return worker


def spec(gateway: str) -> RunSpec:
    return RunSpec(
        scaffold="rlgw-mini",
        scaffold_options={"python": sys.executable, "max_tokens": MAX_TOKENS},
        # No bubblewrap: the verifier writes its marker to the test's directory and reads $PPID.
        sandbox=SandboxSpec("local", {"isolation": "none"}),
        gateway_url=gateway,
        config=AgentConfig(mode="capture", model="tiny-qwen3", max_turns=2, agent_timeout_s=240),
    )


def stored_with_rollout(gateway: str, rollout_id: str) -> int:
    """How many samples the gateway's stream holds for `rollout_id`."""
    found, after = 0, 0
    while True:
        page = httpx.get(gateway + "/v1/trajectories", params={"after": after, "limit": 1000, "wait": 0})
        docs = [orjson.loads(line) for line in page.raise_for_status().content.splitlines() if line]
        if not docs:
            return found
        found += sum(1 for d in docs if d["rollout_id"] == rollout_id)
        after = docs[-1]["cursor"]


def test_rlgw_run_on_ray_spreads_over_both_nodes_with_progress_and_results_in_task_order(
    cluster: tuple[str, set[str]], real_gateway: str, tmp_path: Path
) -> None:
    address, nodes = cluster
    # The first task finishes last (its verifier sleeps), so task order is not completion order.
    tasks = [task("t0", "sleep 4")] + [task(f"t{i}") for i in range(1, 6)]
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in tasks))
    argv = [
        sys.executable, "-m", "rlgw.bin.main", "run", "--scaffold", "rlgw-mini", "--tasks", str(tasks_file),
        "--gateway-url", real_gateway, "--model", "tiny-qwen3", "--max-turns", "2", "--concurrency", "6",
        "--scaffold-option", f"max_tokens={MAX_TOKENS}", "--ray", address, "--json",
    ]  # fmt: skip
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, env=with_repo_on_path(os.environ)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["task_id"] for r in results] == [t.id for t in tasks]
    assert all(r["failed_stage"] is None and r["samples"] and r["reward"] == 1.0 for r in results), results
    ran_on = [r["node"] for r in results]
    print("node per task:", dict(zip((t.id for t in tasks), ran_on, strict=True)))
    assert set(ran_on) == nodes  # both nodes ran tasks
    assert "rlgw-mini capture (ray)" in proc.stderr and "6/6" in proc.stderr  # the progress line
    assert "tasks 6" in proc.stdout and "termination:" in proc.stdout  # the summary table


async def test_a_worker_killed_mid_task_is_retried_and_the_dead_attempt_stores_nothing(
    cluster: tuple[str, set[str]], real_gateway: str, tmp_path: Path
) -> None:
    address, nodes = cluster
    marker = tmp_path / "victim"
    tasks = [task("a0"), task("victim", hang_once(marker)), task("a2")]
    run = asyncio.create_task(run_ray(spec(real_gateway), tasks, address=address, concurrency=3))
    worker = await kill_worker_when_hung(marker, run)
    results = await asyncio.wait_for(run, 240)
    assert [r.task_id for r in results] == ["a0", "victim", "a2"]
    victim = results[1]
    assert victim.failed_stage is None and victim.samples and victim.reward == 1.0, victim
    assert victim.node in nodes
    print(f"killed worker {worker}; the retry ran on node {victim.node[:12]}, stored {len(victim.samples)}")
    # The killed attempt's session was never finished: the stream holds the retry's samples only.
    assert stored_with_rollout(real_gateway, victim.rollout_id) == len(victim.samples)
    assert all(r.failed_stage is None for r in results)


async def test_a_worker_killed_past_its_retries_comes_back_as_an_infra_error_in_its_place(
    cluster: tuple[str, set[str]], real_gateway: str, tmp_path: Path
) -> None:
    address, _ = cluster
    marker = tmp_path / "victim"
    tasks = [task("victim", hang_once(marker)), task("b1")]
    run = asyncio.create_task(run_ray(spec(real_gateway), tasks, address=address, concurrency=2, retries=0))
    await kill_worker_when_hung(marker, run)
    lost, ok = await asyncio.wait_for(run, 240)
    assert lost.task_id == "victim" and lost.termination == TerminationReason.INFRA_ERROR
    assert lost.failed_stage == "ray" and lost.status == "failed"
    assert "WorkerCrashedError" in (lost.error or ""), lost.error
    assert ok.task_id == "b1" and ok.failed_stage is None and ok.samples
    assert stored_with_rollout(real_gateway, lost.rollout_id) == 0


async def test_the_trainers_scaffold_rollouts_run_on_the_cluster(
    cluster: tuple[str, set[str]], real_gateway: str, tmp_path: Path
) -> None:
    address, _ = cluster
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text(json.dumps(task("trainer-task").to_dict()) + "\n")
    rollouts = ScaffoldRollouts(
        "rlgw-mini", str(tasks_file), groups=2, group_size=2, max_turns=2, concurrency=4,
        scaffold_options={"max_tokens": MAX_TOKENS}, ray=address,
    )  # fmt: skip
    collected = await rollouts.collect(real_gateway, None, iteration=0)
    assert collected.failed_runs == 0 and collected.rewards == [1.0] * 4
    assert len(collected.cursors) >= 4
