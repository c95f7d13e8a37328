"""Cline's CLI (`cline` on npm) as an installed scaffold.

Runs `cline auth openai-compatible --baseurl U --modelid M --apikey K`, then
`cline --json --auto-approve true -- TASK` in the workspace, both with Cline's configuration
and state in directories of the scaffold's own (`--config`, `--data-dir`): the first points
the `openai-compatible` provider, made the last used one, at the session's Chat Completions
surface with the session key (`-P openai-compatible -m M` on the second would replace those
settings with ones without the base URL). Update checks are off (`CLINE_NO_AUTO_UPDATE`: no
internet in a sandbox). Capture turns context compaction off (`--compaction off`: its
`agentic` default rewrites the history with a summary); eval keeps Cline's default. Cline has
no turn limit of its own (`--retries` counts consecutive mistakes): `max_turns` is not passed,
the run's wall-clock limit bounds it. Sampling is the session's.

Termination, from the JSON events: the last `run_result` event's `finishReason`: `completed`
is `finish`, `max_iterations` is `max_turns`, `mistake_limit` is `stuck`, `error` and
`aborted` are `error` (`context_length_exceeded` when its text says the context overflowed).
With no `run_result` the base rules apply.
"""

from __future__ import annotations

import shlex
from typing import Any

from rlgw.scaffolds.node_cli import CONTEXT_ERROR, NodeCliScaffold
from rlgw.scaffolds.scaffold import ScaffoldContext, TrajectoryInfo
from rlgw.scaffolds.termination import TerminationReason as R

PROVIDER = "openai-compatible"
_FINISH = {
    "completed": R.FINISH,
    "max_iterations": R.MAX_TURNS,
    "mistake_limit": R.STUCK,
    "error": R.ERROR,
    "aborted": R.ERROR,
}


class ClineScaffold(NodeCliScaffold):
    """Cline headless (`cline --json`), pinned `version` of `cline`."""

    name = "cline"
    package = "cline"
    binary = "cline"
    default_version = "3.0.65"

    def state_args(self, ctx: ScaffoldContext) -> list[str]:
        """Where Cline keeps its configuration and state for this run."""
        return ["--config", f"{ctx.home}/cline", "--data-dir", f"{ctx.home}/cline/data"]

    def run_command(self, ctx: ScaffoldContext) -> str:
        # Cline's own provider setup: a providers file written by hand without the fields it
        # stamps (`updatedAt`) is discarded for its default, the Cline cloud provider.
        auth = [self.executable, "auth", PROVIDER, "--baseurl", ctx.llm.base_url, "--modelid", ctx.llm.model,
                "--apikey", ctx.llm.api_key, *self.state_args(ctx)]  # fmt: skip
        return f"{shlex.join(auth)} >/dev/null && {super().run_command(ctx)}"

    def argv(self, ctx: ScaffoldContext) -> list[str]:
        argv = [
            self.executable, "--json", "--auto-approve", "true",
            *self.state_args(ctx),
        ]  # fmt: skip
        if ctx.mode == "capture":
            argv += ["--compaction", "off"]
        return [*argv, "--"]

    def env(self, ctx: ScaffoldContext) -> dict[str, str]:
        return {"CLINE_NO_AUTO_UPDATE": "1"}

    def parse_events(
        self, events: list[dict[str, Any]], stderr: str, exit_code: int | None, max_turns: int
    ) -> TrajectoryInfo:
        info = TrajectoryInfo()
        results = [e for e in events if e.get("type") == "run_result"]
        if not results:
            if CONTEXT_ERROR.search(stderr):
                info.signals.add(R.CONTEXT_LENGTH_EXCEEDED)
            return info
        result = results[-1]
        info.turns = int(result.get("iterations") or 0)
        finish, text = str(result.get("finishReason")), str(result.get("text") or "")
        reason = _FINISH.get(finish)
        if reason is R.ERROR and CONTEXT_ERROR.search(text):
            reason = R.CONTEXT_LENGTH_EXCEEDED
        if reason is not None:
            info.signals.add(reason)
        info.detail = f"finishReason={finish}: {text[:300]}"
        return info
