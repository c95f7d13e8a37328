"""Shared builders for scaffold tests."""

from __future__ import annotations

from pathlib import Path

from rlgw.scaffolds.scaffold import LLMEndpoint, Mode, ScaffoldContext
from rlgw.scaffolds.tasks import Task

LOGS = Path(__file__).parents[1] / "scaffolds" / "logs"


def ctx(mode: Mode = "capture", max_turns: int = 3) -> ScaffoldContext:
    return ScaffoldContext(
        task=Task("t1", "Fix add() in calc.py so that add(2, 3) == 5."),
        mode=mode,
        llm=LLMEndpoint("http://gw:8000/s/abc/v1", "sk-session", "tiny"),
        workdir="/workspace",
        home="/rlgw/scaffold",
        max_turns=max_turns,
    )


def log(name: str) -> bytes:
    return (LOGS / name).read_bytes()
