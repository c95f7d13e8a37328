"""A gateway fleet for tests: HAProxy running `deploy/haproxy.cfg` in front of three `rlgw serve`
processes, agents that run sessions through it with the real `openai` client, and one trainer-side
follower of the trajectory stream.

The gateways are real subprocesses (`gateway_proc.gateways`; each its own data dir, as if on three
hosts) sharing one store and one session journal given by URL; HAProxy is Debian's `haproxy` (the
tests skip, saying how to install it, where it is absent). A second config file adds only a stats
listener, so the tests read each server's health as HAProxy sees it and run the shipped config
unchanged.

Agents retry what a fleet in trouble answers (a 502 or 503, a connection cut) with the same request
after a short pause, as the `openai` client's own retries would, and record every such answer, so a
test can say what the agents saw while a gateway or the database was down.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import os
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from rlgw.gateway.trajectories.client import FinishSummary, GatewayClient, GatewayClientError
from tests.support.gateway_proc import Gateway, gateways
from tests.support.procs import REPO, free_port, terminate, wait_healthy

HAPROXY_CFG = REPO / "deploy" / "haproxy.cfg"
SERVERS = ("gw1", "gw2", "gw3")  # the shipped config's server lines
RETRY_PAUSE_S = 0.3
# Answers a fleet in trouble gives, which an agent retries: HAProxy's 502/503/504 and the gateway's 503.
RETRIED_STATUSES = (502, 503, 504)


@dataclass
class Balancer:
    """The running HAProxy: the agents' URL and its stats page."""

    url: str
    stats_url: str
    proc: subprocess.Popen

    def states(self) -> dict[str, str]:
        """Each gateway's status as HAProxy's health checks see it (`UP`, `DOWN`, ...)."""
        text = httpx.get(self.stats_url + ";csv", timeout=5).text.lstrip("# ")
        rows = csv.DictReader(io.StringIO(text))
        return {
            r["svname"]: r["status"] for r in rows if r["pxname"] == "gateways" and r["svname"] in SERVERS
        }

    def wait_for(self, name: str, status: str, timeout: float = 30.0) -> float:
        """Wait until HAProxy reports `name` as `status`; the seconds it took."""
        started = time.monotonic()
        while (seen := self.states().get(name)) != status:
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"HAProxy still says {name} is {seen}, not {status}, after {timeout}s")
            time.sleep(0.1)
        return time.monotonic() - started


def require_haproxy() -> str:
    """The `haproxy` binary, or skip saying how to install it."""
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        pytest.skip("HAProxy is not installed here; install Debian's with `apt-get install -y haproxy`")
    return found


@contextlib.contextmanager
def fleet_gateways(engine_url: str, tmp: Path, public_url: str, *args: str) -> Iterator[list[Gateway]]:
    """One `rlgw serve` per server line of the shipped config, started at once, each with its own data
    dir under `tmp` (as if on its own host), handing out base URLs on `public_url`."""
    # Four short turns of the Qwen3 template fit in 1024 positions (gateway_proc's default is 256).
    common = ("--public-url", public_url, "--context-length", "1024", *args)
    specs = [(tmp / name, common, None) for name in SERVERS]
    for path, _, _ in specs:
        path.mkdir()
    with gateways(engine_url, specs) as started:
        yield started


@contextlib.contextmanager
def haproxy(port: int, fleet: list[Gateway], tmp: Path) -> Iterator[Balancer]:
    """HAProxy with the shipped config on `port` in front of `fleet` (`gw1`, `gw2`, ... in order), once
    it sees every gateway up."""
    binary = require_haproxy()
    stats_port = free_port()
    stats = tmp / "stats.cfg"
    stats.write_text(
        f"listen stats\n    bind 127.0.0.1:{stats_port}\n    stats enable\n    stats uri /stats\n"
    )
    env = {**os.environ, "RLGW_LB_BIND": f"127.0.0.1:{port}"}
    servers = zip(SERVERS[: len(fleet)], fleet, strict=True)
    env.update({f"RLGW_{name.upper()}": gw.url.removeprefix("http://") for name, gw in servers})
    log_path = tmp / "haproxy.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [binary, "-db", "-f", str(HAPROXY_CFG), "-f", str(stats)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    balancer = Balancer(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{stats_port}/stats", proc)
    try:
        wait_healthy(balancer.stats_url, proc, log=log_path)
        for name in SERVERS[: len(fleet)]:
            balancer.wait_for(name, "UP")
        yield balancer
    finally:
        terminate(proc)


@dataclass
class SessionRun:
    """What one agent session did: turns, which gateway served each, and what the fleet answered."""

    index: int
    key_only: bool = False  # the agent called `/v1/...` with the session's key, not the session's base URL
    session_id: str = ""
    turns: int = 0
    served_by: list[str] = field(default_factory=list)
    retried: Counter = field(default_factory=Counter)  # status (or "connection") -> times
    errors_503: list[dict[str, Any]] = field(default_factory=list)  # the gateways' 503 bodies
    summary: FinishSummary | None = None


async def _retrying(run: SessionRun, call: Any, deadline: float) -> Any:
    """`await call()` until it answers, retrying (and recording) what a fleet in trouble answers."""
    while True:
        try:
            return await call()
        except openai.APIStatusError as e:
            if e.status_code not in RETRIED_STATUSES or time.monotonic() > deadline:
                raise
            run.retried[e.status_code] += 1
            if e.status_code == 503 and isinstance(e.body, dict) and "message" in e.body:
                run.errors_503.append(e.body)  # the gateway's own error (HAProxy's 503 is HTML)
        except (openai.APIConnectionError, GatewayClientError) as e:
            status = getattr(e, "status", None)
            if (status is not None and status not in RETRIED_STATUSES) or time.monotonic() > deadline:
                raise
            run.retried[status or "connection"] += 1
        await asyncio.sleep(RETRY_PAUSE_S)


async def run_sessions(
    lb: str,
    count: int,
    turns: int,
    *,
    max_tokens: int = 8,
    concurrency: int | None = None,
    give_up_s: float = 300.0,
    on_turn: Any = None,
    key_only_every: int = 0,
) -> list[SessionRun]:
    """`count` agent sessions through the balancer at `lb`, `turns` chat turns each, then finished.

    `on_turn(runs)` is called after every answered turn (a test's hook to act mid-run). A call still
    failing `give_up_s` seconds after the start raises. Every `key_only_every`-th session's agent takes
    only a key: it calls the balancer's `/v1` with the session's key (HAProxy hashes on `Authorization`).
    """
    deadline = time.monotonic() + give_up_s
    runs = [SessionRun(i, key_only=key_only_every > 0 and i % key_only_every == 0) for i in range(count)]
    gate = asyncio.Semaphore(concurrency or count)
    sdk = openai.AsyncOpenAI(base_url=lb, api_key="unused", max_retries=0, timeout=120)
    async with sdk, GatewayClient(lb, timeout=120) as gw:

        def ask(agent: openai.AsyncOpenAI, messages: list[dict[str, Any]]) -> Any:
            return agent.chat.completions.with_raw_response.create(
                model="policy",
                messages=messages,
                max_tokens=max_tokens,
                temperature=1.0,
                extra_body={"chat_template_kwargs": {"enable_thinking": False}},
            )

        async def one(run: SessionRun) -> None:
            async with gate:
                info = await _retrying(run, lambda: gw.create_session(f"fleet-{run.index}"), deadline)
                run.session_id = info.session_id
                base_url = f"{lb}/v1" if run.key_only else info.base_url
                agent = sdk.with_options(base_url=base_url, api_key=info.api_key)
                messages: list[dict[str, Any]] = []
                for k in range(turns):
                    messages.append({"role": "user", "content": f"Session {run.index}, question {k}: go on."})
                    raw = await _retrying(run, lambda: ask(agent, messages), deadline)
                    message = raw.parse().choices[0].message
                    messages.append({"role": "assistant", "content": message.content or ""})
                    run.turns += 1
                    run.served_by.append(raw.headers.get("x-rlgw-gateway", "?"))
                    if on_turn is not None:
                        on_turn(runs)
                run.summary = await _retrying(
                    run, lambda: gw.finish_session(run.session_id, reward=1.0), deadline
                )

        await asyncio.gather(*(one(r) for r in runs))
    return runs


@dataclass
class Followed:
    """What the one trainer-side follower saw: (cursor, session, segment) per sample, and reconnects."""

    seen: list[tuple[int, str, int]] = field(default_factory=list)
    reconnects: int = 0


async def follow(lb: str, want: set[tuple[str, int]], done: asyncio.Event, out: Followed) -> None:
    """Follow the one trajectory stream through the balancer (long polls) until `done` is set and every
    (session, segment) in `want` was seen; a failed poll is asked again after the last cursor seen."""
    after = 0
    async with httpx.AsyncClient(base_url=lb, timeout=30) as http:
        while not (done.is_set() and want <= {(s, g) for _, s, g in out.seen}):
            try:
                r = await http.get("/v1/trajectories", params={"after": after, "limit": 1000, "wait": 1})
                r.raise_for_status()
            except httpx.HTTPError:
                out.reconnects += 1
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            for line in r.content.splitlines():
                doc = orjson.loads(line)
                out.seen.append((doc["cursor"], doc["session_id"], doc["segment"]))
                after = doc["cursor"]
