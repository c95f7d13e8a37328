"""hermes-agent (`hermes-agent` 0.19.0 on PyPI) as an installed scaffold.

`hermes -z TASK -m MODEL --provider custom` runs one task headless ("oneshot": tools auto-approved,
only the final answer on stdout) with a `config.yaml` rlgw writes into a `HERMES_HOME` of its own:
the model on a custom OpenAI-compatible provider (`model.provider: custom`, `base_url`, `api_key`,
`api_mode: chat_completions`) and an output cap in `model.max_tokens`: the run's `max_tokens`, else
8192 (hermes's custom provider otherwise asks for 65,536 output tokens on every call, which a 64K
endpoint refuses with any prompt; hermes then stops, calling it a context overflow). `TIRITH_ENABLED=0`:
its command-scanning helper is otherwise downloaded from GitHub on first use. Hermes refuses a model
with under 64K tokens of context; it learns the context from the endpoint's `/v1/models` (rlgw's
lists none) or falls back to its 256K default, so a gateway with 64K or more runs it as it is.

History: capture turns its context compression off (`compression.enabled: false`: a compression
rewrites the middle of the history into a summary); eval keeps hermes's default. `-z` takes no turn
limit (it runs hermes's own 90 iterations): `max_turns` is not passed, the run's wall clock bounds it.

Termination: hermes's own usage report (`--usage-file`, written after every run, failed or not), the
final answer it prints and its exit code. A turn that ended abnormally is answered `⚠️ No reply: WHY`
(hermes's own wording, exit 0 and `completed` all the same): an iteration or budget limit is
`max_turns`, a context too small `context_length_exceeded`, anything else (the model's content empty
after hermes's retries, retries exhausted, a partial stream) `error`. Otherwise a completed run with
exit 0 is `finish`, a failure whose text names a context overflow is `context_length_exceeded`, and
any other failure `error`. This module knows nothing about sandboxes or
the gateway.
"""

from __future__ import annotations

import re
import shlex

import orjson

from rlgw.scaffolds.install import lock_install
from rlgw.scaffolds.locks import lock_for
from rlgw.scaffolds.node_cli import CONTEXT_ERROR, output_cap
from rlgw.scaffolds.scaffold import InstalledScaffold, ScaffoldContext, TrajectoryInfo
from rlgw.scaffolds.termination import TerminationReason as R

IMPORTS = ("hermes_cli.main", "run_agent")
# The output cap when the run names none: room for any answer, far inside a 64K context.
DEFAULT_MAX_TOKENS = 8192
# How hermes itself reports a request the endpoint refused for its length.
_OVERFLOW = re.compile(r"context overflow", re.I)
# hermes's answer for a turn that ended without a usable reply, and the reasons among them that are limits.
_NO_REPLY = re.compile(r"⚠️ No reply: (.*)")
_NO_REPLY_LIMIT = re.compile(r"iteration limit|iteration/cost budget")
_NO_REPLY_CONTEXT = re.compile(r"context window was too small")
# The iteration budget `hermes -z` runs with (AIAgent's default; `-z` has no flag for it).
ONESHOT_ITERATIONS = 90


class HermesScaffold(InstalledScaffold):
    """hermes-agent's `hermes -z` in a venv of its committed lock (`version`), at `venv`."""

    name = "hermes"

    def __init__(self, *, version: str = "0.19.0", venv: str = "/opt/hermes-agent-venv"):
        self.version = version
        self.venv = venv

    def _install(self, ctx: ScaffoldContext) -> tuple[dict[str, str], str]:
        return lock_install(self.venv, lock_for("hermes-agent", self.version), ctx.home, IMPORTS)

    def config(self, ctx: ScaffoldContext) -> dict:
        """hermes's `config.yaml` for this run (JSON is YAML)."""
        model = {"provider": "custom", "base_url": ctx.llm.base_url, "api_key": ctx.llm.api_key,
                 "default": ctx.llm.model, "api_mode": "chat_completions",
                 "max_tokens": output_cap(ctx) or DEFAULT_MAX_TOKENS}  # fmt: skip
        config: dict = {"model": model}
        if ctx.mode == "capture":
            config["compression"] = {"enabled": False}
        return config

    def install_files(self, ctx: ScaffoldContext) -> dict[str, str]:
        return {
            f"{ctx.home}/instruction.md": ctx.task.instruction,
            f"{ctx.home}/hermes-home/config.yaml": orjson.dumps(self.config(ctx)).decode(),
            **self._install(ctx)[0],
        }

    def install_commands(self, ctx: ScaffoldContext) -> list[str]:
        return [self._install(ctx)[1]]

    def run_command(self, ctx: ScaffoldContext) -> str:
        argv = [f"{self.venv}/bin/hermes", "-m", ctx.llm.model, "--provider", "custom",
                "--usage-file", f"{ctx.home}/usage.json"]  # fmt: skip
        task = f'"$(cat {shlex.quote(ctx.home + "/instruction.md")})"'
        # cd: its tools run in the directory it starts in; stdin closed.
        return f"cd {shlex.quote(ctx.workdir)} && {shlex.join(argv)} -z {task} </dev/null 2>&1"

    def env(self, ctx: ScaffoldContext) -> dict[str, str]:
        return {
            "HERMES_HOME": f"{ctx.home}/hermes-home",
            "TIRITH_ENABLED": "0",
            # Its venv imports top-level `gateway`, `agent`, `tools` packages: a caller's PYTHONPATH
            # (a source checkout of another project) must not shadow them.
            "PYTHONPATH": "",
            "PYTHONUNBUFFERED": "1",
        }

    def log_paths(self, ctx: ScaffoldContext) -> dict[str, str]:
        return {"usage": f"{ctx.home}/usage.json"}

    def parse_trajectory(
        self, ctx: ScaffoldContext, logs: dict[str, bytes], output: str, exit_code: int | None
    ) -> TrajectoryInfo:
        return parse_hermes_usage(logs.get("usage"), output, exit_code)


def parse_hermes_usage(raw: bytes | None, output: str, exit_code: int | None) -> TrajectoryInfo:
    """hermes's `--usage-file` report, its output and exit code -> model calls and termination."""
    try:
        usage = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        usage = {}
    if not isinstance(usage, dict):
        usage = {}
    info = TrajectoryInfo(turns=int(usage.get("api_calls") or 0))
    if not usage:
        return info  # it died before its report: the runner's exit-code rules apply
    info.detail = f"completed={usage.get('completed')} failed={usage.get('failed')} api_calls={info.turns}"
    if failure := usage.get("failure"):
        info.detail += f": {str(failure)[:300]}"
    if no_reply := _NO_REPLY.search(output):
        info.detail += f": No reply: {no_reply[1][:300]}"
        info.signals.add(_no_reply_reason(no_reply[1]))
    elif usage.get("completed") and not usage.get("failed") and exit_code == 0:
        info.signals.add(R.FINISH)
    elif info.turns >= ONESHOT_ITERATIONS:
        info.signals.add(R.MAX_TURNS)
    elif any(p.search(f"{usage.get('failure') or ''}\n{output}") for p in (CONTEXT_ERROR, _OVERFLOW)):
        info.signals.add(R.CONTEXT_LENGTH_EXCEEDED)
    else:
        info.signals.add(R.ERROR)
    return info


def _no_reply_reason(why: str) -> R:
    """The termination a `⚠️ No reply: WHY` answer names."""
    if _NO_REPLY_LIMIT.search(why):
        return R.MAX_TURNS
    return R.CONTEXT_LENGTH_EXCEEDED if _NO_REPLY_CONTEXT.search(why) else R.ERROR
