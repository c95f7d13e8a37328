"""OpenHands as an installed scaffold: the pinned V0 headless entry and the V1 CLI.

V0 (`openhands-ai` 0.59, `python -m openhands.core.main -t TASK --config-file FILE -i N`)
reads the LLM from `LLM_BASE_URL` / `LLM_MODEL` / `LLM_API_KEY` and the run's sampling from
`LLM_TEMPERATURE` / `LLM_TOP_P` / `LLM_MAX_OUTPUT_TOKENS` (else it sends `temperature: 0.0`
on every call). When capturing, its config file pins the `noop` condenser and turns history
truncation off; a user-chosen condenser or truncation raises `CaptureConflictError`; in eval
those settings are left to the user. Its local runtime drives a shell through tmux
(`libtmux`, checked at install) and starts jupyter kernels that leave the process group:
the sandbox's teardown kills them. After the run, the events OpenHands persisted under its
file store are merged into one JSON list (the saved trajectory lacks the state changes).

V1 (the `openhands` 1.16 CLI) runs through `in_sandbox/openhands_v1_launcher.py`, which writes the agent
settings file the CLI reads (the LLM on the endpoint, the run's sampling, the condenser off
when capturing) and sets the turn limit the CLI has no option for; the conversation's own
state is copied out so the settings can be checked (`TrajectoryInfo.detail`).

OpenHands' exit code says little (it exits 0 after an error state): the run is read from its
events (`openhands_events`). This module knows nothing about sandboxes or the gateway.
"""

from __future__ import annotations

import shlex
from typing import Any

import orjson

from rlgw.scaffolds.in_sandbox import IN_SANDBOX
from rlgw.scaffolds.install import lock_install
from rlgw.scaffolds.locks import lock_for
from rlgw.scaffolds.openhands_events import (
    load_json_list,
    load_jsonl,
    parse_v0_events,
    parse_v1_events,
    v1_settings,
)
from rlgw.scaffolds.scaffold import (
    CaptureConflictError,
    InstalledScaffold,
    Mode,
    ScaffoldContext,
    TrajectoryInfo,
)

V1_LAUNCHER_SOURCE = IN_SANDBOX / "openhands_v1_launcher.py"
DEFAULT_VERSIONS = {"v0": "0.59.0", "v1": "1.16.0"}
DISTRIBUTIONS = {"v0": "openhands-ai", "v1": "openhands"}
# What each version's entry imports, checked once its lock is installed (V0's local runtime drives its
# shell in tmux through libtmux).
IMPORTS = {"v0": ("openhands.core.main", "libtmux"),
           "v1": ("openhands_cli.entrypoint", "openhands_cli.setup", "openhands.sdk")}  # fmt: skip
# OpenAI sampling names -> V0's LLM config variables.
_V0_SAMPLING_ENV = {
    "temperature": "LLM_TEMPERATURE",
    "top_p": "LLM_TOP_P",
    "max_tokens": "LLM_MAX_OUTPUT_TOKENS",
    "max_completion_tokens": "LLM_MAX_OUTPUT_TOKENS",
    "seed": "LLM_SEED",
}
# Merges V0's persisted events (`FILE_STORE_PATH/sessions/<sid>/events/<n>.json`) into one list.
_MERGE_V0_EVENTS = (
    "import glob, json, os, sys\n"
    "key = lambda p: (os.path.dirname(p), int(os.path.basename(p).split('.')[0]))\n"
    "paths = sorted(glob.glob(sys.argv[1] + '/sessions/*/events/*.json'), key=key)\n"
    "json.dump([json.load(open(p)) for p in paths], open(sys.argv[2], 'w'))\n"
)


class OpenHandsScaffold(InstalledScaffold):
    """OpenHands V0 headless (`version="v0"`, pinned `openhands_version`) or the V1 CLI (`version="v1"`).

    `condenser` and `history_truncation` are the user's history settings: None means
    "not set" (capture pins them append-only; eval leaves OpenHands' defaults).
    """

    name = "openhands"

    def __init__(
        self,
        *,
        version: str = "v0",
        openhands_version: str | None = None,
        condenser: str | None = None,
        history_truncation: bool | None = None,
        venv: str = "/opt/openhands-venv",
        native_tool_calling: bool = True,
    ):
        if version not in ("v0", "v1"):
            raise ValueError(f"OpenHands version must be 'v0' or 'v1', not {version!r}")
        self.version = version
        self.openhands_version = openhands_version or DEFAULT_VERSIONS[version]
        self.condenser = condenser
        self.history_truncation = history_truncation
        self.venv = venv
        self.native_tool_calling = native_tool_calling

    def check_mode(self, mode: Mode) -> None:
        if mode != "capture":
            return
        if self.condenser not in (None, "noop"):
            raise CaptureConflictError(
                f"OpenHands condenser {self.condenser!r} rewrites history; capture needs 'noop' or unset"
            )
        if self.history_truncation:
            raise CaptureConflictError("OpenHands history truncation rewrites history; capture needs it off")

    def _history_settings(self, mode: Mode) -> tuple[str | None, bool | None]:
        if mode == "capture":
            return "noop", False
        return self.condenser, self.history_truncation

    def _install(self, ctx: ScaffoldContext) -> tuple[dict[str, str], str]:
        lock = lock_for(DISTRIBUTIONS[self.version], self.openhands_version)
        return lock_install(self.venv, lock, ctx.home, IMPORTS[self.version])

    def install_files(self, ctx: ScaffoldContext) -> dict[str, str]:
        files = {f"{ctx.home}/instruction.md": ctx.task.instruction, **self._install(ctx)[0]}
        if self.version == "v1":
            files[f"{ctx.home}/v1_launcher.py"] = V1_LAUNCHER_SOURCE.read_text()
            return files
        condenser, truncation = self._history_settings(ctx.mode)
        lines = ["[core]", f'workspace_base = "{ctx.workdir}"', "", "[agent]"]
        if truncation is not None:
            lines.append(f"enable_history_truncation = {'true' if truncation else 'false'}")
        if condenser is not None:
            lines += ["", "[condenser]", f'type = "{condenser}"']
        files[f"{ctx.home}/config.toml"] = "\n".join(lines) + "\n"
        return files

    def install_commands(self, ctx: ScaffoldContext) -> list[str]:
        commands = [self._install(ctx)[1]]
        if self.version == "v0":
            commands.insert(0, "tmux -V")  # V0's local runtime runs its shell in tmux
        return commands

    def run_command(self, ctx: ScaffoldContext) -> str:
        py = f"{shlex.quote(self.venv)}/bin/python"
        task = f"$(cat {shlex.quote(ctx.home + '/instruction.md')})"
        if self.version == "v0":
            merge = (
                f"{py} -c {shlex.quote(_MERGE_V0_EVENTS)} {shlex.quote(ctx.home + '/file_store')} "
                + shlex.quote(ctx.home + "/events.json")
            )
            return (
                f'{py} -m openhands.core.main -t "{task}" '
                f"--config-file {shlex.quote(ctx.home + '/config.toml')} -d {shlex.quote(ctx.workdir)} "
                f"-i {ctx.max_turns} "
                f"2>&1 </dev/null | tee {shlex.quote(ctx.home + '/openhands.log')}; "
                f"status=${{PIPESTATUS[0]}}; {merge}; exit $status"
            )
        condenser, _ = self._history_settings(ctx.mode)
        args = [
            py, f"{ctx.home}/v1_launcher.py",
            "--max-iterations", str(ctx.max_turns),
            "--condenser", "off" if condenser == "noop" else "default",
            "--sampling", orjson.dumps(ctx.sampling).decode(),
            "--state-out", f"{ctx.home}/state.json",
            "--headless", "--json",
        ]  # fmt: skip
        return (
            f'{shlex.join(args)} -t "{task}" '
            f"</dev/null | tee {shlex.quote(ctx.home + '/events.jsonl')}; exit ${{PIPESTATUS[0]}}"
        )

    def env(self, ctx: ScaffoldContext) -> dict[str, str]:
        env = {
            "LLM_BASE_URL": ctx.llm.base_url,
            "LLM_MODEL": f"openai/{ctx.llm.model}",  # LiteLLM provider prefix: a plain OpenAI-compatible API
            "LLM_API_KEY": ctx.llm.api_key,
            # LiteLLM otherwise fetches its price list from GitHub at start (seconds of retries offline).
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }
        if self.version == "v1":
            env.update({
                "OPENHANDS_PERSISTENCE_DIR": f"{ctx.home}/persistence",
                "OPENHANDS_CONVERSATIONS_DIR": f"{ctx.home}/conversations",
                "OPENHANDS_WORK_DIR": ctx.workdir,
                "OPENHANDS_SUPPRESS_BANNER": "1",
            })  # fmt: skip
            return env
        env.update({
            "LLM_NATIVE_TOOL_CALLING": "true" if self.native_tool_calling else "false",
            "MAX_ITERATIONS": str(ctx.max_turns),
            "RUNTIME": "local",
            "SANDBOX_VOLUMES": f"{ctx.workdir}:/workspace:rw",
            "RUN_AS_OPENHANDS": "false",
            "SKIP_DEPENDENCY_CHECK": "1",
            "AGENT_ENABLE_BROWSING": "false",
            "ENABLE_BROWSER": "false",
            "AGENT_ENABLE_PROMPT_EXTENSIONS": "false",
            "FILE_STORE": "local",
            "FILE_STORE_PATH": f"{ctx.home}/file_store",
            "SAVE_TRAJECTORY_PATH": f"{ctx.home}/trajectory.json",
        })  # fmt: skip
        for key, value in ctx.sampling.items():
            if key in _V0_SAMPLING_ENV:
                env[_V0_SAMPLING_ENV[key]] = str(value)
        return env

    def log_paths(self, ctx: ScaffoldContext) -> dict[str, str]:
        if self.version == "v0":
            return {"events": f"{ctx.home}/events.json", "trajectory": f"{ctx.home}/trajectory.json",
                    "log": f"{ctx.home}/openhands.log"}  # fmt: skip
        return {"events": f"{ctx.home}/events.jsonl", "state": f"{ctx.home}/state.json"}

    def parse_trajectory(
        self, ctx: ScaffoldContext, logs: dict[str, bytes], output: str, exit_code: int | None
    ) -> TrajectoryInfo:
        if self.version == "v0":
            # The persisted events carry the state changes; the saved trajectory is the fallback.
            events = load_json_list(logs.get("events")) or load_json_list(logs.get("trajectory"))
            return parse_v0_events(events, logs.get("log", b"").decode(errors="replace") or output)
        text = logs.get("events", b"").decode(errors="replace") or output
        state = _json_object(logs.get("state"))
        info = parse_v1_events(load_jsonl(text), state)
        if settings := v1_settings(state):
            info.detail = f"{info.detail} [state: {orjson.dumps(settings).decode()}]".strip()
        return info


def _json_object(raw: bytes | None) -> dict[str, Any] | None:
    try:
        doc = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None
