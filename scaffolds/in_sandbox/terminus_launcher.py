"""Runs harbor's Terminus-2 inside the sandbox it works on (copied there as a script).

Harbor drives Terminus-2 from the host against a container environment; here the agent
and its tmux session live in the same sandbox, so this script hands Terminus-2 a
`HostEnvironment` that runs its commands locally with the surface Terminus-2 and its tmux
session use (`exec`, `is_dir`, `upload_file`, `download_file`, `trial_paths.agent_dir`,
`default_user`, `session_id`). Needs Python >= 3.12, `harbor` and `tmux` in the sandbox.
It writes `trajectory.json` (ATIF) into `--logs-dir`.

Terminus-2 always names its tmux session `terminus-2`, so two runs on one machine would
collide ("duplicate session"): each run gets its own tmux server (a private `TMUX_TMPDIR`,
hence its own socket), killed when the run ends. Sampling (`--sampling`, OpenAI names) goes
through Terminus-2's own settings: `temperature`, the rest as LiteLLM call arguments.
Written against harbor 0.26's Terminus2 signature.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace


class HostEnvironment:
    """The minimal environment surface Terminus-2 uses, over local subprocesses."""

    def __init__(self, logs_dir: Path, workdir: str, session_id: str):
        self.trial_paths = SimpleNamespace(agent_dir=logs_dir)
        self.default_user = None
        self.session_id = session_id
        self.workdir = workdir

    async def exec(self, command, cwd=None, env=None, timeout_sec=None, user=None):
        from harbor.environments.base import ExecResult

        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", command, cwd=cwd or self.workdir, env={**os.environ, **(env or {})},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_sec)
        except TimeoutError:
            proc.kill()
            out, err = await proc.communicate()
            return ExecResult(stdout=out.decode(errors="replace"), stderr="timeout", return_code=124)
        return ExecResult(stdout=out.decode(errors="replace"), stderr=err.decode(errors="replace"),
                          return_code=proc.returncode)  # fmt: skip

    async def is_dir(self, path, user=None) -> bool:
        return Path(path).is_dir()  # noqa: ASYNC240 (small local files)

    async def upload_file(self, source_path, target_path, *args, **kwargs) -> None:
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source_path, target_path)

    async def download_file(self, source_path, target_path, *args, **kwargs) -> None:
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source_path, target_path)


async def amain(args: argparse.Namespace) -> int:
    from harbor.agents.terminus_2.terminus_2 import Terminus2
    from harbor.models.agent.context import AgentContext

    logs = Path(args.logs_dir)
    logs.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (small local files)
    sampling = dict(json.loads(args.sampling))
    agent = Terminus2(
        logs_dir=logs,
        model_name=args.model,
        api_base=args.api_base,
        max_turns=args.max_turns,
        temperature=sampling.pop("temperature", None),
        llm_call_kwargs=sampling or None,
        enable_summarize=args.enable_summarize == "true",
        proactive_summarization_threshold=0 if args.enable_summarize != "true" else 8000,
        record_terminal_session=False,
        suppress_max_turns_warning=True,
    )
    env = HostEnvironment(logs, args.workdir, session_id=f"rlgw-{os.getpid()}")
    await agent.setup(env)
    await agent.run(Path(args.instruction_file).read_text(), env, AgentContext())  # noqa: ASYNC240 (small local files)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description="Terminus-2 inside the sandbox")
    p.add_argument("--instruction-file", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--api-base", required=True)
    p.add_argument("--max-turns", type=int, required=True)
    p.add_argument("--enable-summarize", choices=("true", "false"), required=True)
    p.add_argument("--logs-dir", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--sampling", default="{}", help="JSON object of OpenAI sampling parameters")
    args = p.parse_args()
    # A short private directory: tmux's socket path must fit in a sockaddr_un (108 bytes).
    tmux_dir = tempfile.mkdtemp(prefix="rlgw-tmux-", dir="/tmp")
    os.environ["TMUX_TMPDIR"] = tmux_dir
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout's TERM still runs the cleanup
    try:
        return asyncio.run(amain(args))
    finally:
        subprocess.run(["tmux", "kill-server"], capture_output=True, check=False)
        shutil.rmtree(tmux_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
