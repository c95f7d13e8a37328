"""The shared shape of the coding-agent CLIs that ship on npm (Claude Code, Codex, opencode,
qwen-code, pi, Gemini CLI).

Each is one pinned npm package installed into a prefix of its own (`install.npm_install`:
skipped when the prefix already holds that version), configured through its own settings
files and environment, and run headless on the task's instruction with its JSON event
stream on stdout, which is kept (`events.jsonl`) and read back into termination signals by
the concrete scaffold. This module knows nothing about any one CLI's flags or events, and
nothing about sandboxes or the gateway.
"""

from __future__ import annotations

import abc
import re
import shlex
from typing import Any, ClassVar

import orjson

from rlgw.scaffolds.install import npm_check, npm_install
from rlgw.scaffolds.scaffold import InstalledScaffold, ScaffoldContext, TrajectoryInfo


class NodeCliScaffold(InstalledScaffold):
    """An npm CLI run headless. Subclasses set `package`, `binary`, `default_version` and build argv and env.

    `prefix`: where the package is installed in the sandbox (default
    `/opt/rlgw-agents/<name>-<version>`); a prefix that already holds the pinned version is
    reused, so a local sandbox installs once per machine.
    """

    package: ClassVar[str]
    binary: ClassVar[str]
    default_version: ClassVar[str]

    def __init__(self, *, version: str | None = None, prefix: str | None = None):
        self.version = version or self.default_version
        self.prefix = prefix or f"/opt/rlgw-agents/{self.name}-{self.version}"

    @property
    def executable(self) -> str:
        """The CLI's entry point inside the prefix."""
        return f"{self.prefix}/node_modules/.bin/{self.binary}"

    def install_commands(self, ctx: ScaffoldContext) -> list[str]:
        return [
            npm_install(self.prefix, self.package, self.version),
            npm_check(self.prefix, self.package, self.version),
        ]

    def install_files(self, ctx: ScaffoldContext) -> dict[str, str]:
        return {f"{ctx.home}/instruction.md": ctx.task.instruction}

    @abc.abstractmethod
    def argv(self, ctx: ScaffoldContext) -> list[str]:
        """The CLI's command line, without the task (appended as the last argument)."""

    def run_command(self, ctx: ScaffoldContext) -> str:
        task = f'"$(cat {shlex.quote(ctx.home + "/instruction.md")})"'
        events, stderr = shlex.quote(f"{ctx.home}/events.jsonl"), shlex.quote(f"{ctx.home}/stderr.log")
        # cd: the CLIs take the directory they start in as the project; stdin closed, or they wait on it.
        return (
            f"cd {shlex.quote(ctx.workdir)} && {shlex.join(self.argv(ctx))} {task} </dev/null 2>{stderr} "
            f"| tee {events}; status=${{PIPESTATUS[0]}}; tail -c 4000 {stderr} >&2; exit $status"
        )

    def log_paths(self, ctx: ScaffoldContext) -> dict[str, str]:
        return {"events": f"{ctx.home}/events.jsonl", "stderr": f"{ctx.home}/stderr.log"}

    def parse_trajectory(
        self, ctx: ScaffoldContext, logs: dict[str, bytes], output: str, exit_code: int | None
    ) -> TrajectoryInfo:
        text = logs.get("events", b"").decode(errors="replace") or output
        stderr = logs.get("stderr", b"").decode(errors="replace")
        return self.parse_events(json_lines(text), stderr, exit_code, ctx.max_turns)

    @abc.abstractmethod
    def parse_events(
        self, events: list[dict[str, Any]], stderr: str, exit_code: int | None, max_turns: int
    ) -> TrajectoryInfo:
        """The CLI's JSON events (with its stderr, exit code, turn limit) -> turns and termination signals."""


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL text; other lines (banners, warnings) are skipped."""
    events = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(doc, dict):
            events.append(doc)
    return events


def output_cap(ctx: ScaffoldContext) -> int | None:
    """The run's output-token cap (sampling `max_tokens` or `max_completion_tokens`), if it sets one."""
    cap = ctx.sampling.get("max_tokens") or ctx.sampling.get("max_completion_tokens")
    return int(cap) if cap else None


def session_root(base_url: str) -> str:
    """The session's base URL without its trailing `/v1` (Anthropic clients append `/v1/messages`)."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


# How the gateway (OpenAI's, Anthropic's and Gemini's wordings) and the CLIs themselves say the context
# overflowed.
CONTEXT_ERROR = re.compile(
    r"context[_ ]length[_ ]exceeded|maximum context length|exceed context limit|prompt is too long"
    r"|context window|exceeds the maximum number of tokens",
    re.I,
)
