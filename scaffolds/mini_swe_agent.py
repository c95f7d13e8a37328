"""mini-swe-agent (`mini-swe-agent` 2.4.6 on PyPI) as an installed scaffold.

Its `mini` command runs one task unattended (`-y --exit-immediately -t TASK -o TRAJ`) with its
default config (`mini.yaml`: one `bash` tool) merged with a config file rlgw writes: the model
through LiteLLM's `openai/` provider on the endpoint (`model.model_kwargs.api_base`), the run's
sampling in `model_kwargs`, the turn limit as `agent.step_limit`, and the cost limit off (LiteLLM
cannot price a model it does not know; `cost_tracking: ignore_errors`). Its history is one linear
list of messages by design: there is no compaction to turn off. One quirk the ledger sees: a reply
without a valid `bash` call is dropped from the history and answered with a format-error user
message, so the next request does not echo it.

Termination is the trajectory's own `info.exit_status`: `Submitted` (the agent ran `echo
COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`) is `finish`, `LimitsExceeded` is `max_turns`, a context
window error is `context_length_exceeded`, anything else (`RepeatedFormatError`, an exception's
name) is `error`. This module knows nothing about sandboxes or the gateway.
"""

from __future__ import annotations

import shlex

import orjson

from rlgw.scaffolds.install import lock_install
from rlgw.scaffolds.locks import lock_for
from rlgw.scaffolds.scaffold import InstalledScaffold, ScaffoldContext, TrajectoryInfo
from rlgw.scaffolds.termination import TerminationReason as R

IMPORTS = ("minisweagent.run.mini",)
_EXIT_STATUS = {"Submitted": R.FINISH, "LimitsExceeded": R.MAX_TURNS,
                "ContextWindowExceededError": R.CONTEXT_LENGTH_EXCEEDED}  # fmt: skip


class MiniSweAgentScaffold(InstalledScaffold):
    """mini-swe-agent's `mini` in a venv of its committed lock (`version`), at `venv`."""

    name = "mini-swe-agent"

    def __init__(self, *, version: str = "2.4.6", venv: str = "/opt/mini-swe-agent-venv"):
        self.version = version
        self.venv = venv

    def _install(self, ctx: ScaffoldContext) -> tuple[dict[str, str], str]:
        return lock_install(self.venv, lock_for("mini-swe-agent", self.version), ctx.home, IMPORTS)

    def config(self, ctx: ScaffoldContext) -> dict:
        """The config merged over `mini.yaml` (JSON is YAML)."""
        kwargs = {"api_base": ctx.llm.base_url, "api_key": ctx.llm.api_key, **ctx.sampling}
        return {
            "model": {"model_name": f"openai/{ctx.llm.model}", "model_kwargs": kwargs,
                      "cost_tracking": "ignore_errors"},
            "agent": {"step_limit": ctx.max_turns, "cost_limit": 0},
        }  # fmt: skip

    def install_files(self, ctx: ScaffoldContext) -> dict[str, str]:
        return {
            f"{ctx.home}/instruction.md": ctx.task.instruction,
            f"{ctx.home}/rlgw.yaml": orjson.dumps(self.config(ctx)).decode(),
            **self._install(ctx)[0],
        }

    def install_commands(self, ctx: ScaffoldContext) -> list[str]:
        return [self._install(ctx)[1]]

    def run_command(self, ctx: ScaffoldContext) -> str:
        argv = [f"{self.venv}/bin/mini", "-y", "--exit-immediately", "-c", "mini.yaml",
                "-c", f"{ctx.home}/rlgw.yaml", "-o", f"{ctx.home}/mini.traj.json"]  # fmt: skip
        task = f'"$(cat {shlex.quote(ctx.home + "/instruction.md")})"'
        # cd: its local environment runs each command in the directory it starts in; stdin closed.
        return f"cd {shlex.quote(ctx.workdir)} && {shlex.join(argv)} -t {task} </dev/null 2>&1"

    def env(self, ctx: ScaffoldContext) -> dict[str, str]:
        return {
            "MSWEA_CONFIGURED": "true",  # else its first run asks for a default model and key
            "MSWEA_GLOBAL_CONFIG_DIR": f"{ctx.home}/mini-config",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else LiteLLM fetches its price list from GitHub
            "PYTHONUNBUFFERED": "1",
        }

    def log_paths(self, ctx: ScaffoldContext) -> dict[str, str]:
        return {"trajectory": f"{ctx.home}/mini.traj.json"}

    def parse_trajectory(
        self, ctx: ScaffoldContext, logs: dict[str, bytes], output: str, exit_code: int | None
    ) -> TrajectoryInfo:
        return parse_mini_trajectory(logs.get("trajectory"))


def parse_mini_trajectory(raw: bytes | None) -> TrajectoryInfo:
    """mini-swe-agent's saved trajectory -> model calls and the termination its `exit_status` names."""
    info = TrajectoryInfo()
    try:
        doc = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        doc = {}
    run = (doc.get("info") or {}) if isinstance(doc, dict) else {}
    info.turns = int((run.get("model_stats") or {}).get("api_calls") or 0)
    status = str(run.get("exit_status") or "")
    if status:
        info.signals.add(_EXIT_STATUS.get(status, R.ERROR))
        info.detail = f"exit_status={status}"
    return info
