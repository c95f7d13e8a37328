"""Shared pieces of the real-agent runs: the tasks, the sandbox factory, the checks.

Each real run installs an agent from PyPI into its own cached venv (`venvs.agent_venv`) and
runs it, through `InstalledAgent`, on the local sandbox against a capture session of a real
`rlgw serve` in front of `rlgw engine` on the tiny Qwen3 fixture (the `real_gateway` fixture
in `conftest.py`). The tiny model cannot solve anything; what is checked is the plumbing:
the agent's LLM calls reach the session, the run ends for the forced reason, the verifier's
reward lands on the stored sample, history stays one sample (or segments whose causes name
the condenser), and nothing the run started is left in the process table.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from rlgw.gateway.sample import validate_sample
from rlgw.gateway.trajectories.client import GatewayClient
from rlgw.sandboxes.local import LocalSandbox, marked_pids, running
from rlgw.scaffolds.agent import AgentConfig, InstalledAgent, RunResult
from rlgw.scaffolds.scaffold import InstalledScaffold
from rlgw.scaffolds.tasks import Task, Verifier
from rlgw.scaffolds.termination import TerminationReason

MODEL = "tiny-qwen3"
# Partial credit for leaving the starting file alone, so a stored 0.25 can only come from the verifier.
_VERIFY = """import json, os, pathlib, sys
solved = {check}
intact = pathlib.Path("README.md").read_text() == "notes\\n"
reward = 1.0 if solved else (0.25 if intact else 0.0)
pathlib.Path(os.environ["RLGW_REWARD_DIR"], "reward.json").write_text(json.dumps({{"reward": reward}}))
"""


def _task(task_id: str, instruction: str, files: dict[str, str], check: str) -> Task:
    return Task(
        task_id,
        instruction,
        setup_files={"README.md": "notes\n", **files},
        verifier=Verifier(
            "python3 verify.py", files={"verify.py": _VERIFY.format(check=check)}, timeout_s=60
        ),
    )


TASKS = {
    "hello": _task(
        "hello",
        "Create a file hello.txt in the current directory containing exactly the word hello.",
        {},
        'pathlib.Path("hello.txt").exists() and pathlib.Path("hello.txt").read_text().strip() == "hello"',
    ),
    "fix-add": _task(
        "fix-add",
        "calc.py has a bug: add(2, 3) returns -1. Fix add() so that it returns the sum.",
        {"calc.py": "def add(a, b):\n    return a - b\n"},
        '__import__("calc").add(2, 3) == 5',
    ),
    "count": _task(
        "count",
        "Write the number of lines of data.txt into a file count.txt.",
        {"data.txt": "a\nb\nc\n"},
        'pathlib.Path("count.txt").exists() and pathlib.Path("count.txt").read_text().strip() == "3"',
    ),
}
# Every real run with an unsolved task and an intact README gets this reward from the verifier.
UNSOLVED_REWARD = 0.25


def overflowing(task: Task, words: int = 8000) -> Task:
    """`task` with an instruction longer than the real-run gateway's 32768-token context."""
    padding = " ".join(f"note{i}" for i in range(words))
    return Task(f"{task.id}-overflow", f"{task.instruction}\n\nBackground notes: {padding}",
                task.setup_files, task.verifier)  # fmt: skip


@dataclass
class Sandboxes:
    """A sandbox factory that remembers what it made (to check the process table afterwards)."""

    base_dir: Path
    made: list[LocalSandbox] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)

    def __call__(self) -> LocalSandbox:
        sb = LocalSandbox(base_dir=self.base_dir)
        self.made.append(sb)
        return sb

    def leftovers(self) -> list[str]:
        """Running processes any of the sandboxes started (by their marker), as `pid cmdline`."""
        found = []
        for sb in self.made:
            for pid in running(marked_pids(sb.id)):
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                found.append(f"{pid} {cmd[:200]}")
        return found


@dataclass
class Checked:
    """What a real run showed, for the report table."""

    result: RunResult
    llm_calls: int
    samples: int
    leftovers: list[str]


async def run_real(
    gateway_url: str,
    scaffold: InstalledScaffold,
    task: Task,
    tmp_path: Path,
    *,
    max_turns: int,
    agent_timeout_s: float,
    sampling: dict | None = None,
) -> Checked:
    """One capture run through `InstalledAgent` on local sandboxes; returns what the gateway stored."""
    sandboxes = Sandboxes(tmp_path)
    config = AgentConfig(
        mode="capture", model=MODEL, max_turns=max_turns, agent_timeout_s=agent_timeout_s,
        install_timeout_s=1800, sampling=sampling, artifacts_dir=tmp_path / "artifacts",
    )  # fmt: skip
    async with GatewayClient(gateway_url) as client:
        result = await InstalledAgent(scaffold, sandboxes, client, config).run(task)
        llm_calls = 0
        for s in result.samples:
            sample = (await client.get_trajectory(s["cursor"])).sample
            validate_sample(sample)
            assert sample.reward == result.reward, (sample.reward, result.reward)
            assert sample.metadata.get("termination_reason") == str(result.termination)
            llm_calls = max(llm_calls, int(sample.metadata.get("turns") or 0))
    return Checked(result, llm_calls, len(result.samples), sandboxes.leftovers())


def assert_plumbing(run: Checked, expected: TerminationReason, *, min_calls: int = 1) -> None:
    """The checks every real run must pass (see the module docstring)."""
    r = run.result
    detail = f"{r.termination} {r.failed_stage} {r.error}\n{r.detail}\n{r.output_tail[-3000:]}"
    assert r.failed_stage is None, detail
    assert r.termination is expected, detail
    assert r.reward == UNSOLVED_REWARD, detail
    assert run.samples == 1 and not r.rejects, (run.samples, r.rejects)
    assert run.llm_calls >= min_calls, detail
    assert run.leftovers == [], run.leftovers


def report_line(agent: str, name: str, run: Checked) -> str:
    """One row for the closing table (printed with -s)."""
    r = run.result
    return (f"REAL-RUN {agent:<14} {name:<22} calls={run.llm_calls:<3} samples={run.samples} "
            f"reason={r.termination!s:<24} wall={r.duration_s:6.1f}s leftovers={len(run.leftovers)} "
            f"pid={os.getpid()}")  # fmt: skip
