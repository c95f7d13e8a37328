"""A gateway fleet for real: HAProxy (`deploy/haproxy.cfg`, Debian's haproxy) in front of three
`rlgw serve` processes, each with its own data dir as if on three hosts, sharing one PostgreSQL
trajectory store and session journal, in front of one embedded engine (tiny Qwen3) behind a
recording proxy.

- 60 agent sessions (the real `openai` client, a few turns each, all at once; one in five takes
  only a key, so HAProxy places it by its `Authorization` header) spread over the gateways; one
  gateway is SIGKILLed mid-run; HAProxy's health check takes it out; its sessions go on at the
  others, which restore them from the journal; every session finishes with its one
  sample, whose every sampled span is the engine's own output for the series before it (the same
  ledger, not a stale or rebuilt one); one trainer-side follower of the one stream sees every
  sample exactly once.
- PostgreSQL restarted mid-run: turns answer the gateway's own 503 while it is down, the agents'
  retries go on once it is back, and nothing committed before is lost.

Each test prints its figures (sessions, turns, samples, samples seen, duplicates, losses).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tests.support.e2e import check_engine_spans
from tests.support.fleet import (
    SERVERS,
    Balancer,
    Followed,
    SessionRun,
    fleet_gateways,
    follow,
    haproxy,
    run_sessions,
)
from tests.support.gateway_proc import Gateway
from tests.support.procs import engine_server, free_port
from tests.support.recording_proxy import Recorder, recording_proxy

# About 4 minutes on 2 loaded shared cores, over half of it starting the three gateways.
pytestmark = pytest.mark.slow

SESSIONS, TURNS = 60, 4
KEY_ONLY_EVERY = 5  # 12 of the 60 agents take only a key (HAProxy hashes on their Authorization header)


@pytest.fixture(scope="module")
def engine(tiny_qwen3: Path) -> Iterator[tuple[str, Recorder]]:
    """The embedded engine behind a recording proxy: the proxy's URL and what it recorded."""
    with engine_server(tiny_qwen3) as url, recording_proxy(url) as (proxy, recorder):
        yield proxy, recorder


@pytest.fixture(scope="module")
def fleet(
    engine: tuple[str, Recorder], pg_cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Balancer, list[Gateway]]]:
    """Three gateways on one fresh PostgreSQL database, behind HAProxy (one fleet for the module:
    starting three gateways takes a minute on a loaded machine; the failover test, which kills one,
    runs last)."""
    db, tmp = pg_cluster.fresh_url(), tmp_path_factory.mktemp("fleet")
    port = free_port()
    with fleet_gateways(engine[0], tmp, f"http://127.0.0.1:{port}", "--store", db, "--journal", db) as gws:
        with haproxy(port, gws, tmp) as balancer:
            yield balancer, gws


def figures(runs: list[SessionRun], followed: Followed) -> dict[str, Any]:
    """The run's figures: what the agents did, what was stored, what the one follower saw."""
    stored = {(r.session_id, seg.segment) for r in runs if r.summary for seg in r.summary.samples}
    # This run's samples only: the module's fleet keeps one database for its tests.
    seen = [(sid, seg) for _, sid, seg in followed.seen if (sid, seg) in stored]
    return {
        "sessions": len(runs),
        "turns": sum(r.turns for r in runs),
        "samples": len(stored),
        "samples seen": len(set(seen)),
        "duplicates": len(seen) - len(set(seen)),
        "losses": len(stored - set(seen)),
        "retried": dict(sum((r.retried for r in runs), Counter())),
        "follower reconnects": followed.reconnects,
    }


def check_ledgers(lb: str, recorder: Recorder, runs: list[SessionRun]) -> None:
    """Every session stored one sample whose sampled spans are the engine's outputs, one per turn."""
    for r in runs:
        assert r.summary is not None and len(r.summary.samples) == 1 and not r.summary.rejects, r
        doc = httpx.get(f"{lb}/v1/trajectories/{r.summary.samples[0].cursor}").raise_for_status().json()
        spans = check_engine_spans(SimpleNamespace(recorder=recorder), doc)
        assert len(spans) == r.turns == TURNS, (r.session_id, len(spans), r.turns)


async def run_and_follow(lb: str, count: int, **kwargs: Any) -> tuple[list[SessionRun], Followed]:
    """Run the sessions while one follower reads the stream; the follower ends once it saw them all."""
    followed, done, want = Followed(), asyncio.Event(), set()
    follower = asyncio.create_task(follow(lb, want, done, followed))
    runs = await run_sessions(lb, count, TURNS, **kwargs)
    want |= {(r.session_id, s.segment) for r in runs if r.summary for s in r.summary.samples}
    done.set()
    await asyncio.wait_for(follower, 120)
    return runs, followed


def test_postgres_restarted_mid_run_gives_clear_503s_and_loses_nothing_committed(
    fleet: tuple[Balancer, list[Gateway]], engine: tuple[str, Recorder], pg_cluster: Any
) -> None:
    balancer, _ = fleet
    count, down_s = 20, 4.0
    outage: dict[str, Any] = {}

    def restart_postgres_later(runs: list[SessionRun]) -> None:
        # Once every session committed a turn on average, stop the database. The agents share this
        # event loop, so none goes on while it stops; it starts again `down_s` seconds later.
        if outage or sum(r.turns for r in runs) < count:
            return
        pg_cluster.stop("fast")
        outage["committed_before"] = {r.session_id: r.turns for r in runs}
        timer = threading.Timer(down_s, pg_cluster.start)
        timer.start()
        outage["timer"] = timer

    runs, followed = asyncio.run(
        run_and_follow(balancer.url, count, on_turn=restart_postgres_later, give_up_s=240)
    )
    outage["timer"].join()
    errors = [e for r in runs for e in r.errors_503]
    stats = figures(runs, followed)
    print(f"\npostgres down {down_s:.0f}s; the gateways' 503s: {len(errors)}; first: {errors[:1]}")
    print("figures:", stats)
    assert errors, "no turn saw the gateway's 503 while the database was down"
    assert {e.get("code") for e in errors} == {"store_unavailable"}, errors[:3]
    # Nothing committed is lost: every session's sample holds all its turns, those before the outage too.
    check_ledgers(balancer.url, engine[1], runs)
    assert stats["samples"] == count and stats["samples seen"] == count
    assert stats["duplicates"] == 0 and stats["losses"] == 0


def test_sixty_sessions_survive_a_gateway_killed_mid_run(
    fleet: tuple[Balancer, list[Gateway]], engine: tuple[str, Recorder]
) -> None:
    balancer, gws = fleet
    killed: dict[str, Any] = {}

    def kill_the_busiest(runs: list[SessionRun]) -> None:
        # A third of the way through, the gateway that served most so far dies.
        if killed or sum(r.turns for r in runs) < SESSIONS * TURNS // 3:
            return
        busiest, _ = Counter(g for r in runs for g in r.served_by).most_common(1)[0]
        victim = gws[SERVERS.index(busiest)].proc
        victim.kill()  # SIGKILL: no drain, no shutdown, as a host that dies
        victim.wait()
        killed.update(
            name=busiest, at=time.monotonic(), on_it={r.index for r in runs if busiest in r.served_by}
        )

    runs, followed = asyncio.run(
        run_and_follow(balancer.url, SESSIONS, on_turn=kill_the_busiest, key_only_every=KEY_ONLY_EVERY)
    )
    victim = killed["name"]
    assert balancer.states()[victim].startswith("DOWN")  # HAProxy's health check took it out
    moved = [r for r in runs if r.index in killed["on_it"] and r.served_by[-1] != victim]
    key_only_moved = sum(r.key_only for r in moved)
    served = Counter(g for r in runs for g in r.served_by)
    stats = figures(runs, followed)
    print(
        f"\nfailover: killed {victim}; turns served per gateway {dict(served)}; sessions moved {len(moved)}"
        f" ({key_only_moved} of them key-only)"
    )
    print("figures:", stats)
    assert len(set(served) - {victim}) == 2 and moved  # spread over the fleet, and the victim's moved
    check_ledgers(balancer.url, engine[1], runs)
    assert stats["samples"] == SESSIONS and stats["samples seen"] == SESSIONS
    assert stats["duplicates"] == 0 and stats["losses"] == 0
