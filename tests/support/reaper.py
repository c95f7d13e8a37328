"""Nothing outlives a test run: a watchdog process kills what the run started once pytest is gone.

As a pytest plugin, `pytest_configure` tags the run: it appends a fresh id to `RLGW_TEST_RUN` in
pytest's environment, which every process the run starts inherits (engines, gateways, PostgreSQL and
its backends, vLLM/SGLang and their workers, Ray, npm and node), with no change at any call site. It
then starts this file as a script, in a session of its own so that a signal to pytest's process group
spares it. The watchdog waits on pytest's pid (a pidfd, so a reused pid cannot fool it) and, once
pytest has exited for any reason (a normal end, SIGTERM, SIGKILL), terminates every process whose
environment carries the id, every descendant of those (PostgreSQL's backends overwrite their
environment with their process title), and every descendant of pytest it saw while pytest ran (a child
started with a cleared environment), then SIGKILLs those still there after a grace period. It names on stderr
what it had to kill: after a normal end, that is a test's leak.

Nested runs (a test that runs pytest) append their own id, so each run's watchdog reaps its own part.
This file imports only the standard library: it runs as the watchdog, outside pytest.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

MARK = "RLGW_TEST_RUN"
# How often the watchdog records pytest's descendants, and how long reaped processes get to exit.
POLL_S = 1.0
GRACE_S = 3.0

Proc = tuple[int, str]  # (pid, start time): a pid alone may be reused


def pytest_configure(config: object) -> None:
    """Tag this run's processes with a fresh id and start its watchdog."""
    run_id = uuid.uuid4().hex[:12]
    outer = os.environ.get(MARK)
    os.environ[MARK] = f"{outer}:{run_id}" if outer else run_id
    env = {k: v for k, v in os.environ.items() if k != MARK}  # the watchdog must not reap itself
    subprocess.Popen(
        [sys.executable, __file__, str(os.getpid()), run_id],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of `pid`, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return int(fields[1]), fields[19]


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def carrying(name: str, value: str) -> set[int]:
    """Pids of the processes whose environment variable `name` holds `value` among its `:`-parts."""
    prefix = name.encode() + b"="
    found = set()
    for pid in _pids():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        for entry in environ.split(b"\0"):
            if entry.startswith(prefix) and value in entry[len(prefix) :].decode(errors="replace").split(":"):
                found.add(pid)
    return found


def descendants(roots: set[int]) -> set[Proc]:
    """Every live process below `roots` (transitively), with its start time."""
    children: dict[int, list[Proc]] = {}
    for pid in _pids():
        stat = _stat(pid)
        if stat:
            children.setdefault(stat[0], []).append((pid, stat[1]))
    found: set[Proc] = set()
    todo = list(roots)
    while todo:
        for proc in children.get(todo.pop(), []):
            if proc not in found:
                found.add(proc)
                todo.append(proc[0])
    return found


def alive(procs: set[Proc]) -> set[Proc]:
    """Those of `procs` still running (the same process: same pid and start time)."""
    return {(pid, start) for pid, start in procs if (s := _stat(pid)) and s[1] == start}


def tree(pids: set[int]) -> set[Proc]:
    """The live processes among `pids` and all their descendants, with their start times."""
    return {(pid, s[1]) for pid in pids if (s := _stat(pid))} | descendants(pids)


def leftovers(run_id: str, seen: set[Proc]) -> set[Proc]:
    """The run's processes still alive: tagged ones, those seen below pytest, and their descendants."""
    me = os.getpid()
    return {p for p in tree(carrying(MARK, run_id) | {pid for pid, _ in alive(seen)}) if p[0] != me}


def _signal(procs: set[Proc], sig: int) -> None:
    for pid, _ in alive(procs):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def command(pid: int) -> str:
    """The command line of `pid` (cut to 160 characters), or "?" when it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
    except OSError:
        return "?"


def reap(run_id: str, seen: set[Proc]) -> set[Proc]:
    """SIGTERM the run's leftovers, SIGKILL what remains after `GRACE_S`; return all it signalled."""
    reaped: set[Proc] = set()
    for _ in range(10):  # a process may fork while it is being reaped
        procs = leftovers(run_id, seen) - reaped
        if not procs:
            break
        for pid, _ in sorted(procs):
            if not (cmd := command(pid)):
                continue  # a zombie (an empty command line): it has exited, its parent not yet waited
            with contextlib.suppress(OSError):  # stderr may be a pipe nobody reads any more
                print(f"test reaper: run {run_id} left pid {pid}: {cmd}", file=sys.stderr)
        _signal(procs, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        while alive(procs) and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal(procs, signal.SIGKILL)
        reaped |= procs
    return reaped


def watch(pytest_pid: int, run_id: str) -> None:
    """Record pytest's descendants until it exits, then reap the run."""
    seen: set[Proc] = set()
    try:
        pidfd = os.pidfd_open(pytest_pid)
    except ProcessLookupError:
        pidfd = None
    if pidfd is not None:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        while not poller.poll(POLL_S * 1000):
            seen = alive(seen) | descendants({pytest_pid})
        os.close(pidfd)
    reap(run_id, seen)


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2])
