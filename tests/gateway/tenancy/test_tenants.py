"""Tenants: keys stored hashed, the admin API and `rlgw tenants`, and who may see what."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rlgw.gateway.errors import Conflict
from rlgw.gateway.tenancy.limits import Limits
from rlgw.gateway.tenancy.store import DB_NAME, TenantStore
from rlgw.gateway.tenancy.tenants import KeyTable, key_digest
from tests.support.fault_engine import FaultEngine, fault_engine
from tests.support.gateway_proc import Gateway, gateway

# ---------------------------------------------------------------- the pieces alone


def test_key_table_sources_and_admin() -> None:
    table = KeyTable()
    assert len(table) == 0  # open gateway
    table.add("static-key", "a")
    table.replace_stored({key_digest("stored-key"): "b"})
    assert table.owner("static-key") == "a" and table.owner("stored-key") == "b"
    assert table.owner("stored-kez") is None
    table.replace_stored({})
    assert table.owner("stored-key") is None
    assert not table.is_admin("admin-key")  # no admin key set: nobody is admin
    table.set_admin_key("admin-key")
    assert table.is_admin("admin-key") and not table.is_admin("admin-kez") and not table.is_admin(None)
    assert table.owner("admin-key") is None  # the admin key is no tenant's key


def test_an_admin_key_alone_closes_the_gateway() -> None:
    table = KeyTable()
    table.set_admin_key("admin-key")
    assert len(table) == 1


def test_tenant_store_keeps_only_digests(tmp_path: Path) -> None:
    store = TenantStore.open(tmp_path)
    tenant, key = store.add("team-a", Limits(open_sessions=3))
    assert tenant.key_digest == key_digest(key)
    with pytest.raises(Conflict):
        store.add("team-a", Limits())
    store.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    assert key.encode() not in raw  # neither the database nor its WAL holds the key
    reopened = TenantStore.open(tmp_path)
    [again] = reopened.list()
    assert (again.name, again.limits, again.key_digest) == ("team-a", Limits(3, None, None), key_digest(key))
    assert reopened.set_limits("team-a", Limits(in_flight=5)) and not reopened.set_limits("x", Limits())
    assert reopened.list()[0].limits == Limits(None, 5, None)
    assert reopened.revoke("team-a") and not reopened.revoke("team-a")
    assert reopened.list() == []


def test_tenant_store_sees_another_processs_changes(tmp_path: Path) -> None:
    mine, other = TenantStore.open(tmp_path), TenantStore.open(tmp_path)
    mine.list()
    assert not mine.changed()
    other.add("team-b", Limits())
    assert mine.changed()
    assert [t.name for t in mine.list()] == ["team-b"]
    assert not mine.changed()


# ---------------------------------------------------------------- over HTTP, a real gateway

ADMIN_KEY = "admin-0123456789abcdef"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
STATIC = "legacy:legacy-key-0123456789"


@pytest.fixture(scope="module")
def fe(tiny_qwen3: Path) -> Iterator[FaultEngine]:
    with fault_engine(tiny_qwen3) as engine:
        yield engine


@pytest.fixture(scope="module")
def gw(fe: FaultEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("tenants")
    key_file = tmp / "admin.key"
    key_file.write_text(ADMIN_KEY + "\n")
    env = {"RLGW_TENANT_KEYS": STATIC}
    with gateway(fe.url, tmp, "--admin-key-file", str(key_file), env=env) as g:
        yield g


def _add(gw: Gateway, name: str, **limits: int) -> str:
    r = httpx.post(gw.url + "/admin/tenants", json={"name": name, "limits": limits}, headers=ADMIN)
    assert r.status_code == 201, r.text
    return r.json()["api_key"]


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _session(gw: Gateway, key: str) -> dict[str, Any]:
    r = httpx.post(gw.url + "/v1/sessions", json={"task_id": "t"}, headers=_bearer(key))
    assert r.status_code == 200, r.text
    return r.json()


def test_admin_api_needs_the_admin_key(gw: Gateway) -> None:
    tenant_key = _add(gw, "plain")
    for headers in ({}, _bearer("wrong"), _bearer(tenant_key), _bearer("legacy-key-0123456789")):
        for method, path in (("GET", "/admin/tenants"), ("DELETE", "/admin/tenants/plain")):
            r = httpx.request(method, gw.url + path, headers=headers)
            assert r.status_code == 401, (headers, path)
            assert r.json()["error"]["type"] == "authentication_error"
        r = httpx.post(gw.url + "/admin/tenants", json={"name": "x"}, headers=headers)
        assert r.status_code == 401
    assert httpx.post(gw.url + "/admin/tenants", json={"name": "plain"}, headers=ADMIN).status_code == 409
    assert httpx.post(gw.url + "/admin/tenants", json={"name": "no spaces"}, headers=ADMIN).status_code == 400


def test_a_limit_past_sqlites_integer_is_a_400_and_changes_nothing(gw: Gateway) -> None:
    _add(gw, "bounded", in_flight=4)
    huge = {"in_flight": 2**63}  # one past SQLite's INTEGER: the store's write would raise (a 500)
    r = httpx.put(gw.url + "/admin/tenants/bounded/limits", json=huge, headers=ADMIN)
    assert r.status_code == 400, r.text
    r = httpx.post(gw.url + "/admin/tenants", json={"name": "too-big", "limits": huge}, headers=ADMIN)
    assert r.status_code == 400, r.text
    listed = httpx.get(gw.url + "/admin/tenants", headers=ADMIN).json()["data"]
    assert {t["name"]: t["limits"]["in_flight"] for t in listed}.get("bounded") == 4
    assert "too-big" not in {t["name"] for t in listed}


def test_added_tenant_works_at_once_and_revoked_stops_at_once(gw: Gateway) -> None:
    key = _add(gw, "team-new", open_sessions=7)
    s = _session(gw, key)
    listed = httpx.get(gw.url + "/admin/tenants", headers=ADMIN).json()["data"]
    mine = next(t for t in listed if t["name"] == "team-new")
    assert mine["limits"]["open_sessions"] == 7 and mine["open_sessions"] == 1
    assert "api_key" not in mine and key not in json.dumps(listed)
    r = httpx.delete(gw.url + "/admin/tenants/team-new", headers=ADMIN)
    assert r.status_code == 200 and r.json() == {"name": "team-new", "revoked": True}
    assert httpx.post(gw.url + "/v1/sessions", json={"task_id": "t"}, headers=_bearer(key)).status_code == 401
    assert httpx.get(gw.url + f"/v1/sessions/{s['session_id']}", headers=_bearer(key)).status_code == 401
    assert httpx.delete(gw.url + "/admin/tenants/team-new", headers=ADMIN).status_code == 404


def test_configured_tenant_keys_keep_working_beside_stored_ones(gw: Gateway) -> None:
    assert _session(gw, "legacy-key-0123456789")["session_id"]


def test_tenants_persist_across_a_restart(fe: FaultEngine, tmp_path: Path) -> None:
    env = {"RLGW_ADMIN_KEY": ADMIN_KEY}
    with gateway(fe.url, tmp_path, env=env) as first:
        key = _add(first, "durable", in_flight=3)
    with gateway(fe.url, tmp_path, env=env) as second:
        assert _session(second, key)["session_id"]
        [t] = httpx.get(second.url + "/admin/tenants", headers=ADMIN).json()["data"]
        assert t["limits"]["in_flight"] == 3


def test_cli_adds_lists_and_revokes(gw: Gateway, tmp_path: Path) -> None:
    key_file = tmp_path / "admin.key"
    key_file.write_text(ADMIN_KEY)

    def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "rlgw.bin.main", "tenants", "--url", gw.url, *args]
        clean = {k: v for k, v in os.environ.items() if k != "RLGW_ADMIN_KEY"}
        return subprocess.run(cmd, capture_output=True, text=True, env={**clean, **(env or {})}, timeout=60)

    added = cli("--admin-key-file", str(key_file), "add", "cli-team", "--tokens-per-minute", "5000")
    assert added.returncode == 0, added.stderr
    key = json.loads(added.stdout)["api_key"]
    assert _session(gw, key)["session_id"]
    listed = cli("list", env={"RLGW_ADMIN_KEY": ADMIN_KEY})
    assert listed.returncode == 0, listed.stderr
    row = next(t for t in json.loads(listed.stdout)["data"] if t["name"] == "cli-team")
    assert row["limits"]["tokens_per_minute"] == 5000
    relimited = cli("limits", "cli-team", "--in-flight", "2", env={"RLGW_ADMIN_KEY": ADMIN_KEY})
    assert relimited.returncode == 0, relimited.stderr
    listed = json.loads(cli("list", env={"RLGW_ADMIN_KEY": ADMIN_KEY}).stdout)["data"]
    row = next(t for t in listed if t["name"] == "cli-team")
    assert row["limits"] == {"open_sessions": None, "in_flight": 2, "tokens_per_minute": None}
    assert _session(gw, key)["session_id"]  # the key is unchanged
    assert cli("limits", "nobody", env={"RLGW_ADMIN_KEY": ADMIN_KEY}).returncode == 1
    assert cli("list").returncode != 0  # no admin key anywhere: refused before any request
    denied = cli("list", env={"RLGW_ADMIN_KEY": "wrong"})
    assert denied.returncode == 1 and "401" in denied.stderr
    assert cli("revoke", "cli-team", env={"RLGW_ADMIN_KEY": ADMIN_KEY}).returncode == 0
    assert httpx.post(gw.url + "/v1/sessions", json={"task_id": "t"}, headers=_bearer(key)).status_code == 401


def test_a_tenant_sees_only_its_own_sessions_and_trajectories(gw: Gateway) -> None:
    a, b = _add(gw, "iso-a"), _add(gw, "iso-b")
    sa = _session(gw, a)
    sid = sa["session_id"]
    turn = httpx.post(
        sa["base_url"] + "/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}]},
        headers=_bearer(sa["api_key"]),
    )
    assert turn.status_code == 200, turn.text
    done = httpx.post(gw.url + f"/v1/sessions/{sid}/finish", json={"reward": 1.0}, headers=_bearer(a))
    [sample] = done.json()["samples"]
    cursor = sample["cursor"]
    # B gets the same answer as for things that do not exist.
    assert httpx.get(gw.url + f"/v1/sessions/{sid}", headers=_bearer(b)).status_code == 404
    assert httpx.get(gw.url + f"/v1/trajectories/{cursor}", headers=_bearer(b)).status_code == 404
    assert httpx.get(gw.url + "/v1/trajectories", headers=_bearer(b)).content == b""
    mine = httpx.get(gw.url + "/v1/trajectories", headers=_bearer(a)).content.splitlines()
    assert [json.loads(line)["cursor"] for line in mine] == [cursor]
    assert httpx.get(gw.url + f"/v1/trajectories/{cursor}", headers=_bearer(a)).status_code == 200


def test_a_session_key_only_calls_its_own_session(gw: Gateway) -> None:
    a = _add(gw, "keys-a")
    s1, s2 = _session(gw, a), _session(gw, a)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(s2["base_url"] + "/chat/completions", json=body, headers=_bearer(s1["api_key"]))
    assert r.status_code == 401
    # A session key is not a tenant key: it cannot open sessions or read the tenant's data.
    assert (
        httpx.post(gw.url + "/v1/sessions", json={"task_id": "t"}, headers=_bearer(s1["api_key"])).status_code
        == 401
    )
    assert httpx.get(gw.url + "/v1/trajectories", headers=_bearer(s1["api_key"])).status_code == 401
    assert (
        httpx.get(gw.url + f"/v1/sessions/{s1['session_id']}", headers=_bearer(s1["api_key"])).status_code
        == 401
    )


def test_wrong_or_missing_keys_get_401_without_saying_what_exists(gw: Gateway) -> None:
    s = _session(gw, _add(gw, "probe"))
    real = s["base_url"] + "/chat/completions"
    made_up = real.replace(s["session_id"], "s-" + "0" * 32)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    for headers in ({}, _bearer("sk-rlgw-guess")):
        answers = [httpx.post(url, json=body, headers=headers) for url in (real, made_up)]
        assert [r.status_code for r in answers] == [401, 401]
        assert answers[0].json() == answers[1].json()
        by_key = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers)
        assert by_key.status_code == 401
    for path in (f"/v1/sessions/{s['session_id']}", "/v1/sessions/s-nothing", "/v1/trajectories/1"):
        assert httpx.get(gw.url + path).status_code == 401


def test_tenant_key_file_stays_hashed_on_disk(gw: Gateway) -> None:
    key = _add(gw, "disk")
    conn = sqlite3.connect(gw.data_dir / DB_NAME)
    rows = conn.execute("SELECT * FROM tenants WHERE name = 'disk'").fetchall()
    conn.close()
    assert rows and key not in repr(rows) and key_digest(key) in [r[1] for r in rows]


def test_gateways_on_one_data_dir_follow_each_others_changes(gw: Gateway, fe: FaultEngine) -> None:
    env = {"RLGW_TENANT_KEYS": STATIC, "RLGW_ADMIN_KEY": ADMIN_KEY}
    with gateway(fe.url, gw.data_dir.parent, env=env) as other:
        key = _add(gw, "shared")

        def status_on_other() -> int:
            r = httpx.post(other.url + "/v1/sessions", json={"task_id": "t"}, headers=_bearer(key))
            return r.status_code

        _eventually(lambda: status_on_other() == 200)
        assert httpx.delete(gw.url + "/admin/tenants/shared", headers=ADMIN).status_code == 200
        _eventually(lambda: status_on_other() == 401)


def _eventually(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the other gateway did not pick the change up"
        time.sleep(0.25)
