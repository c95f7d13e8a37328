"""A finish or delete whose answer was lost is safe to send again, to the same store from another
gateway process: the gateway that stored it exits right after the commit (a test-only kill point,
`RLGW_TEST_KILL_AT`, `os._exit` as SIGKILL would), and a second gateway on the same store and
journal answers the retry with the stored summary (not a 404, and nothing stored twice).

Both deployments: gateways sharing one data dir (SQLite + journal files), and gateways with their
own data dirs on one PostgreSQL store and journal (as on separate hosts).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson
import pytest

from rlgw.gateway.sessions.finish import KILL_AT_ENV
from tests.support.fault_engine import FaultEngine
from tests.support.gateway_proc import Gateway, gateways


@pytest.fixture(params=["files", "postgresql"])
def deployment(request: pytest.FixtureRequest, tmp_path: Path):
    """Gateway number `i`'s tmp dir and extra `rlgw serve` arguments."""
    if request.param == "files":
        return lambda i: (tmp_path, [])  # one shared data dir, as gateways on one host
    url = request.getfixturevalue("pg_url")
    return lambda i: (tmp_path / f"host{i}", ["--store", url, "--journal", url])


def _open(gw: Gateway, task: str) -> dict:
    r = httpx.post(gw.url + "/v1/sessions", json={"task_id": task, "rollout_id": f"r-{task}"})
    r.raise_for_status()
    return r.json()


def _turn(gw: Gateway, s: dict) -> None:
    r = httpx.post(
        gw.url + f"/s/{s['session_id']}/v1/chat/completions",
        headers={"Authorization": f"Bearer {s['api_key']}"},
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
    )
    r.raise_for_status()


def _killed_during(gw: Gateway, method: str, path: str, **kw) -> None:
    """Send a request the gateway dies answering; check it died at the kill point (exit 137)."""
    with pytest.raises(httpx.TransportError):
        httpx.request(method, gw.url + path, timeout=30, **kw)
    assert gw.proc.wait(timeout=30) == 137


def _samples(gw: Gateway) -> list[dict]:
    r = httpx.get(gw.url + "/v1/trajectories")
    r.raise_for_status()
    return [orjson.loads(line) for line in r.content.splitlines()]


def test_finish_and_delete_retried_after_a_kill_between_store_and_answer(fe: FaultEngine, deployment) -> None:
    fin = {"reward": 1.0}
    specs = []
    for i, kill_at in enumerate(["finish-stored", "delete-stored", ""]):
        tmp, args = deployment(i)
        tmp.mkdir(parents=True, exist_ok=True)
        specs.append((tmp, args, {KILL_AT_ENV: kill_at}))
    # All three start at once (start-up is most of this test's time); the second and third hold
    # nothing of the first's sessions and restore them from the journal on their first call.
    with gateways(fe.url, specs) as (first, second, third):
        kept, dropped = _open(first, "kept"), _open(first, "dropped")
        _turn(first, kept)
        _killed_during(first, "POST", f"/v1/sessions/{kept['session_id']}/finish", json=fin)

        retried = httpx.post(second.url + f"/v1/sessions/{kept['session_id']}/finish", json=fin)
        assert retried.status_code == 200, retried.text
        summary = retried.json()
        assert summary["session_id"] == kept["session_id"] and len(summary["samples"]) == 1
        _killed_during(second, "DELETE", f"/v1/sessions/{dropped['session_id']}")

        again = httpx.post(third.url + f"/v1/sessions/{kept['session_id']}/finish", json=fin)
        assert again.status_code == 200 and again.json() == summary
        gone = httpx.delete(third.url + f"/v1/sessions/{dropped['session_id']}")
        assert gone.status_code == 200
        assert gone.json() == {"session_id": dropped["session_id"], "deleted": True}
        # A deleted session has no summary to give: its finish is still a 404, and a repeated
        # delete answers as the first did.
        late = httpx.post(third.url + f"/v1/sessions/{dropped['session_id']}/finish", json=fin)
        assert late.status_code == 404
        assert httpx.delete(third.url + f"/v1/sessions/{dropped['session_id']}").status_code == 200
        assert httpx.post(third.url + "/v1/sessions/s-never/finish", json=fin).status_code == 404
        # The runner that lost the finish's answer is retried with the same rollout id (Ray's retry
        # of a dead worker): no new session, the stored summary instead. A deleted rollout stored
        # nothing, so it may run again.
        rerun = httpx.post(third.url + "/v1/sessions", json={"task_id": "kept", "rollout_id": "r-kept"})
        assert rerun.status_code == 409, rerun.text
        error = rerun.json()["error"]
        assert error["code"] == "rollout_stored" and error["param"] == "rollout_id"
        assert error["summary"] == summary and summary["reward"] == 1.0
        assert _open(third, "dropped")["rollout_id"] == "r-dropped"
        stored = _samples(third)
        assert [s["cursor"] for s in stored] == [summary["samples"][0]["cursor"]]  # stored once
        assert stored[0]["session_id"] == kept["session_id"]
