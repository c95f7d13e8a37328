"""Operations: liveness and readiness, draining on SIGTERM, and logs that never hold a key."""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rlgw.gateway.trajectories.store import DB_NAME
from tests.support.fault_engine import FaultEngine, fault_engine
from tests.support.gateway_proc import Gateway, gateway

TENANT_KEY = "key-a-0123456789abcdef"
ADMIN_KEY = "admin-0123456789abcdef"
A = {"Authorization": f"Bearer {TENANT_KEY}"}
USER = [{"role": "user", "content": "hi"}]
# After its graceful shutdown uvicorn re-raises the signal it caught, so a drained process ends
# "killed by SIGTERM"; anything else (a crash, a SIGKILL after the wait) is not clean.
CLEAN_EXIT = (0, -signal.SIGTERM)


@pytest.fixture(scope="module")
def fe(tiny_qwen3: Path) -> Iterator[FaultEngine]:
    with fault_engine(tiny_qwen3) as engine:
        yield engine


@pytest.fixture(autouse=True)
def _reset(fe: FaultEngine) -> None:
    fe.script.clear()
    fe.calls.clear()


@pytest.fixture(scope="module")
def gw(fe: FaultEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    env = {"RLGW_TENANT_KEYS": f"team-a:{TENANT_KEY}", "RLGW_ADMIN_KEY": ADMIN_KEY}
    with gateway(fe.url, tmp_path_factory.mktemp("ops"), env=env) as g:
        yield g


def _session(gw: Gateway) -> dict[str, Any]:
    r = httpx.post(gw.url + "/v1/sessions", json={"task_id": "t"}, headers=A)
    assert r.status_code == 200, r.text
    return r.json()


def _turn(s: dict[str, Any], timeout: float = 30.0) -> httpx.Response:
    return httpx.post(
        s["base_url"] + "/chat/completions",
        json={"messages": USER},
        headers={"Authorization": f"Bearer {s['api_key']}"},
        timeout=timeout,
    )


def test_healthz_and_readyz(gw: Gateway) -> None:
    health = httpx.get(gw.url + "/healthz").json()
    assert health["status"] == "ok" and set(health["sessions"]) == {"open", "finished"}
    assert httpx.get(gw.url + "/health").json() == health  # the alias
    r = httpx.get(gw.url + "/readyz")
    assert r.status_code == 200, r.text
    checks = {"engine": "ok", "store": "ok", "journal": "ok", "template_probe": "ok"}
    assert r.json() == {"ready": True, "checks": checks}


def test_readyz_fails_while_the_store_cannot_be_written(gw: Gateway) -> None:
    # Another writer holding SQLite's write lock is what a stuck or read-only store looks like.
    conn = sqlite3.connect(gw.data_dir / DB_NAME, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    try:
        r = httpx.get(gw.url + "/readyz", timeout=30)
    finally:
        conn.execute("ROLLBACK")
        conn.close()
    assert r.status_code == 503
    checks = r.json()["checks"]
    assert checks["engine"] == "ok" and checks["store"] != "ok"
    assert httpx.get(gw.url + "/readyz", timeout=30).status_code == 200


def test_readyz_fails_when_the_engine_is_gone(tiny_qwen3: Path, tmp_path: Path) -> None:
    with contextlib.ExitStack() as engine_life:
        own_engine = engine_life.enter_context(fault_engine(tiny_qwen3))
        with gateway(own_engine.url, tmp_path) as g:
            assert httpx.get(g.url + "/readyz", timeout=30).status_code == 200
            engine_life.close()  # the engine stops; the gateway stays up
            r = httpx.get(g.url + "/readyz", timeout=30)
            assert r.status_code == 503
            assert r.json()["checks"]["engine"] != "ok" and r.json()["checks"]["store"] == "ok"
            assert httpx.get(g.url + "/healthz").status_code == 200  # alive, just not ready


def test_logs_carry_ids_and_never_keys(gw: Gateway, fe: FaultEngine) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    added = httpx.post(gw.url + "/admin/tenants", json={"name": "logged"}, headers=admin).json()
    stored_key = added["api_key"]
    r = httpx.post(
        gw.url + "/v1/sessions", json={"task_id": "t"}, headers={"Authorization": f"Bearer {stored_key}"}
    )
    s = r.json()
    assert _turn(s).status_code == 200
    fe.script.append("500")
    assert _turn(s).status_code >= 500  # an error path logs too
    for wrong in ("sk-rlgw-wrong-guess-0001", TENANT_KEY[:-1] + "X"):
        httpx.post(
            gw.url + "/v1/sessions", json={"task_id": "t"}, headers={"Authorization": f"Bearer {wrong}"}
        )
    httpx.post(gw.url + f"/v1/sessions/{s['session_id']}/finish", json={}, headers=A)  # another tenant: 404
    time.sleep(0.5)  # let the process flush its last lines
    logs = gw.logs()
    for key in (TENANT_KEY, ADMIN_KEY, stored_key, s["api_key"], "sk-rlgw-wrong-guess-0001"):
        assert key not in logs
    opened = [json.loads(line) for line in logs.splitlines() if '"session opened"' in line]
    assert {"session": s["session_id"], "tenant": "logged"}.items() <= opened[-1].items()


def _wait_for(predicate: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.02)


def test_sigterm_drains_a_turn_in_flight_then_closes_the_store(fe: FaultEngine, tmp_path: Path) -> None:
    with gateway(fe.url, tmp_path, "--drain-timeout", "20") as g:
        s = _session(g)
        fe.script.append("slow")  # the engine takes 3 s to answer
        replies: list[httpx.Response] = []
        agent = threading.Thread(target=lambda: replies.append(_turn(s)))
        agent.start()
        _wait_for(lambda: fe.calls)
        g.proc.send_signal(signal.SIGTERM)
        agent.join(timeout=30)
        assert replies and replies[0].status_code == 200, replies and replies[0].text
        assert replies[0].json()["choices"][0]["message"]["content"] == "Hello there."
        assert g.proc.wait(timeout=30) in CLEAN_EXIT
    # The stores were closed cleanly: SQLite checkpointed and removed every write-ahead log.
    assert not list(g.data_dir.glob("*-wal"))
    # And the drained turn was recorded: a gateway restarted on the data dir holds it.
    with gateway(fe.url, tmp_path) as again:
        doc = httpx.get(again.url + f"/v1/sessions/{s['session_id']}").json()
        assert doc["turns"] == 1 and doc["tokens"] > 0


def test_sigterm_drain_is_bounded(fe: FaultEngine, tmp_path: Path) -> None:
    with gateway(fe.url, tmp_path, "--drain-timeout", "0.5") as g:
        s = _session(g)
        fe.script.append("slow")
        replies: list[Any] = []

        def agent() -> None:
            try:
                replies.append(_turn(s))
            except httpx.HTTPError as exc:  # the connection closes under it
                replies.append(exc)

        thread = threading.Thread(target=agent)
        thread.start()
        _wait_for(lambda: fe.calls)
        g.proc.send_signal(signal.SIGTERM)
        assert g.proc.wait(timeout=30) in CLEAN_EXIT
        thread.join(timeout=30)
        # Cut off before the engine's 3 s were up: no successful reply was sent.
        assert replies and not (isinstance(replies[0], httpx.Response) and replies[0].status_code == 200)
