"""The task format: what an agent is asked to do, the files it starts with, how it is graded.

One task per JSONL line:

    {"id": "fix-add", "instruction": "Make test.sh pass.",
     "setup_files": {"calc.py": "def add(a, b):\n    return a - b\n"},
     "verifier": {"command": "python -c 'import calc; assert calc.add(2, 3) == 5'",
                  "files": {}, "timeout_s": 120},
     "metadata": {"source": "demo"}}

The verifier runs in a clean sandbox holding the agent's frozen workspace plus
`verifier.files`. Its reward is, first match wins: `$RLGW_REWARD_DIR/reward.json`
(`{"reward": x}`), `$RLGW_REWARD_DIR/reward.txt` (a number), else 1.0 for exit code 0 and
0.0 otherwise. This module owns parsing and validation only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson


class TaskFormatError(ValueError):
    """A tasks file has invalid lines; the message lists every problem."""


@dataclass(frozen=True, slots=True)
class Verifier:
    """How to grade a run: a command, extra files for the grading sandbox, a time limit."""

    command: str
    files: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 300.0


@dataclass(frozen=True, slots=True)
class Task:
    """One task: an id, the agent's instruction, its starting files and its verifier."""

    id: str
    instruction: str
    setup_files: dict[str, str] = field(default_factory=dict)
    verifier: Verifier | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Task:
        """Validate and build a task; raises `ValueError` naming the bad field."""
        if not isinstance(doc, dict):
            raise ValueError("a task must be a JSON object")
        for name in ("id", "instruction"):
            if not isinstance(doc.get(name), str) or not doc[name].strip():
                raise ValueError(f"{name!r} must be a non-empty string")
        files = doc.get("setup_files") or {}
        _check_files("setup_files", files)
        verifier = None
        if (v := doc.get("verifier")) is not None:
            if not isinstance(v, dict) or not isinstance(v.get("command"), str) or not v["command"].strip():
                raise ValueError("'verifier' must be an object with a non-empty 'command'")
            _check_files("verifier.files", v.get("files") or {})
            timeout = v.get("timeout_s", 300.0)
            if not isinstance(timeout, int | float) or timeout <= 0:
                raise ValueError("'verifier.timeout_s' must be a positive number")
            verifier = Verifier(
                command=v["command"], files=dict(v.get("files") or {}), timeout_s=float(timeout)
            )
        metadata = doc.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise ValueError("'metadata' must be an object")
        return cls(doc["id"], doc["instruction"], dict(files), verifier, dict(metadata))

    def to_dict(self) -> dict[str, Any]:
        """Inverse of `from_dict`."""
        doc: dict[str, Any] = {
            "id": self.id,
            "instruction": self.instruction,
            "setup_files": self.setup_files,
        }
        if self.verifier is not None:
            doc["verifier"] = {
                "command": self.verifier.command,
                "files": self.verifier.files,
                "timeout_s": self.verifier.timeout_s,
            }
        doc["metadata"] = self.metadata
        return doc


def _check_files(name: str, files: Any) -> None:
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in files.items()
    ):
        raise ValueError(f"{name!r} must map relative paths to text contents")
    for path in files:
        if path.startswith("/") or ".." in Path(path).parts:
            raise ValueError(f"{name!r} path {path!r} must be relative and stay inside the workspace")


def load_tasks(path: Path) -> list[Task]:
    """Read a JSONL tasks file; every bad line is reported at once, with its line number."""
    tasks: list[Task] = []
    problems: list[str] = []
    seen: set[str] = set()
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            task = Task.from_dict(orjson.loads(line))
        except (orjson.JSONDecodeError, ValueError) as e:
            problems.append(f"{path}:{lineno}: {e}")
            continue
        if task.id in seen:
            problems.append(f"{path}:{lineno}: duplicate task id {task.id!r}")
        seen.add(task.id)
        tasks.append(task)
    if problems:
        raise TaskFormatError(f"{len(problems)} invalid task line(s):\n" + "\n".join(problems))
    if not tasks:
        raise TaskFormatError(f"{path} holds no tasks")
    return tasks


def parse_reward(reward_json: bytes | None, reward_txt: bytes | None, exit_code: int | None) -> float:
    """The verifier's reward: reward.json, else reward.txt, else the exit code (0 -> 1.0)."""
    if reward_json is not None:
        try:
            value = orjson.loads(reward_json)
            value = value["reward"] if isinstance(value, dict) else value
            reward = float(value)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"reward.json must hold {{'reward': number}}: {reward_json[:100]!r}") from e
    elif reward_txt is not None:
        try:
            reward = float(reward_txt.decode().strip())
        except ValueError as e:
            raise ValueError(f"reward.txt must hold one number: {reward_txt[:100]!r}") from e
    else:
        return 1.0 if exit_code == 0 else 0.0
    if not math.isfinite(reward):
        raise ValueError(f"reward is not finite: {reward}")
    return reward
