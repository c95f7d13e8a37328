"""Detached jobs: shell scripts that run a command outside the request that started it.

A remote sandbox API that answers one HTTP request per command (ROCK's `execute`) cannot
carry a command longer than its own request limit: ROCK's in-sandbox server cuts every
request at 85 s and its admin reports the cut as a *successful* reply with exit code -1 and
no output, while the command keeps running; a command timeout comes back the same way.
So a command runs as a job, the way ROCK's own agent runner uses `nohup`:

- the launch script writes the command to `DIR/cmd.sh` and starts it with `setsid` (its own
  process group, detached from the request), output to `DIR/out`, exit code to `DIR/exit`
  (written last, by rename, so its presence means "done");
- a poll script waits in-request for at most a few seconds (well under any cut), then
  prints the job's state on stderr and, once done, its output on stdout;
- a kill script ends the whole process group (TERM, then KILL) and prints what it wrote; an
  output script prints it again when the kill's reply was lost (a cut: a process group whose
  members linger as zombies, where no init reaps them, keeps the kill waiting its full grace).

Every script is safe to send again when its reply was lost (a cut, a reset connection):
the launch starts the job only if `mkdir DIR` succeeds, polls only read, and `DIR` stays
until the caller has the result and removes it (`cleanup_script`) in a later request.

This module builds the scripts and reads their replies; it knows nothing about HTTP.
"""

from __future__ import annotations

import base64
import posixpath
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

# Longest a poll request waits in-sandbox for the job; far below ROCK's 85 s cut.
POLL_WAIT_S = 20.0
# Seconds between SIGTERM and SIGKILL when a job runs past its limit.
KILL_GRACE_S = 2.0
_STATE = re.compile(r"RLGW_JOB (DONE (-?\d+)|RUNNING|MISSING|OUTPUT)")


@dataclass(frozen=True, slots=True)
class JobState:
    """What one reply said: done (with the exit code), still running, missing, output follows
    (a kill or output script's reply), or nothing."""

    done: bool = False
    exit_code: int | None = None
    running: bool = False
    missing: bool = False
    output: bool = False


def read_state(stderr: str) -> JobState:
    """The job state a poll script printed; an empty `JobState` when the reply carries none."""
    found = _STATE.findall(stderr)
    if not found:
        return JobState()
    whole, code = found[-1]
    if whole.startswith("DONE"):
        return JobState(done=True, exit_code=int(code))
    return JobState(running=whole == "RUNNING", missing=whole == "MISSING", output=whole == "OUTPUT")


@dataclass(frozen=True, slots=True)
class DetachedJob:
    """One job's directory inside the sandbox, and the scripts that drive it.

    `max_output`: bytes of output returned (the tail), None for all of it.
    """

    dir: str
    max_output: int | None = None

    def launch_script(self, command: str, *, cwd: str | None, env: Mapping[str, str] | None) -> str:
        """Start `command` detached, in `cwd`, with `env` exported; a no-op once the job exists."""
        body = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in (env or {}).items())
        if cwd:
            body += f"cd {cwd} || exit 1\n"  # unquoted on purpose: `$HOME/work` must expand
        body += command + "\n"
        d = shlex.quote(self.dir)
        encoded = base64.b64encode(body.encode()).decode()
        runner = (
            'echo $$ > "$1/pid"; bash "$1/cmd.sh" < /dev/null > "$1/out" 2>&1; '
            'echo $? > "$1/exit.tmp"; mv "$1/exit.tmp" "$1/exit"'
        )
        return (
            f"mkdir -p {shlex.quote(posixpath.dirname(self.dir))}\n"
            f"if mkdir {d} 2>/dev/null; then printf %s {encoded} | base64 -d > {d}/cmd.sh\n"
            f"  setsid bash -c {shlex.quote(runner)} _ {d} < /dev/null > /dev/null 2>&1 &\nfi\n"
        )

    def poll_script(self, wait_s: float) -> str:
        """Wait up to `wait_s` seconds for the job; report its state; once done print its output."""
        d = shlex.quote(self.dir)
        polls = max(0, round(wait_s / 0.1))  # 0.1 s steps: `$SECONDS` counts whole seconds only
        return (
            f"n={polls}\n"
            f"while [ ! -e {d}/exit ] && [ -d {d} ] && [ $n -gt 0 ]; do sleep 0.1; n=$((n - 1)); done\n"
            f'if [ -e {d}/exit ]; then echo "RLGW_JOB DONE $(cat {d}/exit)" >&2; {self._output()}\n'
            f"elif [ -d {d} ]; then echo 'RLGW_JOB RUNNING' >&2\n"
            f"else echo 'RLGW_JOB MISSING' >&2; fi\n"
        )

    def kill_script(self, grace_s: float) -> str:
        """End the job's whole process group; print its output so far (as `output_script`)."""
        d = shlex.quote(self.dir)
        steps = max(1, round(grace_s / 0.1))
        return (
            f"p=$(cat {d}/pid 2>/dev/null); n={steps}\n"
            f'if [ -n "$p" ]; then kill -TERM -- "-$p" 2>/dev/null\n'
            f'  while kill -0 -- "-$p" 2>/dev/null && [ $n -gt 0 ]; do sleep 0.1; n=$((n - 1)); done\n'
            f'  kill -KILL -- "-$p" 2>/dev/null; fi\n' + self.output_script()
        )

    def output_script(self) -> str:
        """Print the job's output so far, marked on stderr so that a lost reply is told apart."""
        return f"echo 'RLGW_JOB OUTPUT' >&2; {self._output()}\n"

    def cleanup_script(self) -> str:
        """Remove the job's directory (sent with a later request, once the result is in hand)."""
        return f"rm -rf {shlex.quote(self.dir)}\n"

    def _output(self) -> str:
        d = shlex.quote(self.dir)
        if self.max_output is None:
            return f"cat {d}/out 2>/dev/null"
        return f"tail -c {int(self.max_output)} {d}/out 2>/dev/null"
