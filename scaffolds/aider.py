"""aider (`aider-chat` 0.86.2 on PyPI) as an installed scaffold.

`aider --message TASK --yes-always` runs one request-and-edit exchange (with aider's own reflection
rounds when its edits fail to apply) and exits. The model is LiteLLM's `openai/` provider on the
endpoint (`--openai-api-base`, `--openai-api-key`); the run's sampling goes through a model settings
file (`extra_params`, which aider merges into every call, so its own `temperature: 0` is overridden).
No git (`--no-git`: no commit-message side calls), no update check, no analytics, plain output.

History: aider summarizes its chat history with the weak model (the main model, for one it does not
know) once it passes `--max-chat-history-tokens`; capture sets that beyond any context so nothing is
ever summarized; eval leaves aider's default.

Termination: aider has no event stream and exits 0 after `--message` whatever happened, so the run's
output is read: a LiteLLM error aider gave up on is `error`, its "has hit a token limit" report is
`context_length_exceeded`, anything else after exit 0 is `finish`. This module knows nothing about
sandboxes or the gateway.
"""

from __future__ import annotations

import re
import shlex

import orjson

from rlgw.scaffolds.install import lock_install
from rlgw.scaffolds.locks import lock_for
from rlgw.scaffolds.scaffold import InstalledScaffold, ScaffoldContext, TrajectoryInfo
from rlgw.scaffolds.termination import TerminationReason as R

IMPORTS = ("aider.main",)
# Beyond any model's context: aider never starts summarizing.
NO_SUMMARY_TOKENS = 1 << 40
_EXHAUSTED = re.compile(r"has hit a token limit|exhausted context window", re.I)
_CALL = re.compile(r"^TO LLM ", re.M)
_API_ERROR = re.compile(r"litellm\.\w+(Error|Exception)\b")


class AiderScaffold(InstalledScaffold):
    """aider in a venv of its committed lock (`version`), at `venv`."""

    name = "aider"

    def __init__(self, *, version: str = "0.86.2", venv: str = "/opt/aider-venv"):
        self.version = version
        self.venv = venv

    def _install(self, ctx: ScaffoldContext) -> tuple[dict[str, str], str]:
        return lock_install(self.venv, lock_for("aider-chat", self.version), ctx.home, IMPORTS)

    def install_files(self, ctx: ScaffoldContext) -> dict[str, str]:
        settings = [{"name": f"openai/{ctx.llm.model}", "extra_params": dict(ctx.sampling)}]
        return {
            f"{ctx.home}/instruction.md": ctx.task.instruction,
            f"{ctx.home}/model-settings.yml": orjson.dumps(settings).decode(),  # JSON is YAML
            **self._install(ctx)[0],
        }

    def install_commands(self, ctx: ScaffoldContext) -> list[str]:
        return [self._install(ctx)[1]]

    def run_command(self, ctx: ScaffoldContext) -> str:
        h = ctx.home
        argv = [
            f"{self.venv}/bin/aider", "--model", f"openai/{ctx.llm.model}",
            "--openai-api-base", ctx.llm.base_url, "--openai-api-key", ctx.llm.api_key,
            "--model-settings-file", f"{h}/model-settings.yml",
            "--yes-always", "--no-git", "--no-check-update", "--analytics-disable",
            "--no-show-model-warnings", "--no-pretty", "--no-fancy-input",
            "--input-history-file", f"{h}/input.history",
            "--chat-history-file", f"{h}/chat.history.md", "--llm-history-file", f"{h}/llm.history",
        ]  # fmt: skip
        if ctx.mode == "capture":
            argv += ["--max-chat-history-tokens", str(NO_SUMMARY_TOKENS)]
        task = f'"$(cat {shlex.quote(h + "/instruction.md")})"'
        # cd: aider takes the directory it starts in as the project; stdin closed.
        return f"cd {shlex.quote(ctx.workdir)} && {shlex.join(argv)} --message {task} </dev/null 2>&1"

    def env(self, ctx: ScaffoldContext) -> dict[str, str]:
        # LiteLLM otherwise fetches its price list from GitHub at start (seconds of retries offline).
        return {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONUNBUFFERED": "1"}

    def log_paths(self, ctx: ScaffoldContext) -> dict[str, str]:
        return {"llm": f"{ctx.home}/llm.history", "chat": f"{ctx.home}/chat.history.md"}

    def parse_trajectory(
        self, ctx: ScaffoldContext, logs: dict[str, bytes], output: str, exit_code: int | None
    ) -> TrajectoryInfo:
        return parse_aider_output(logs.get("llm", b"").decode(errors="replace"), output, exit_code)


def parse_aider_output(llm_history: str, output: str, exit_code: int | None) -> TrajectoryInfo:
    """aider's LLM log (one `TO LLM` block per call) and console output -> calls and termination."""
    info = TrajectoryInfo(turns=len(_CALL.findall(llm_history)))
    if m := _EXHAUSTED.search(output):
        info.signals.add(R.CONTEXT_LENGTH_EXCEEDED)
        info.detail = m[0]
    elif m := _API_ERROR.search(output):
        info.signals.add(R.ERROR)
        info.detail = m[0]
    elif exit_code == 0:
        info.signals.add(R.FINISH)
    return info
