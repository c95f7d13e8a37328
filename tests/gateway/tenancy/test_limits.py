"""Per-tenant limits: the token window and limit table alone, then each limit's 429 over HTTP."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from rlgw.gateway.tenancy.limits import Limits, LimitTable, RateLimited, TokenWindow
from tests.support.fault_engine import FaultEngine, fault_engine
from tests.support.gateway_proc import Gateway, gateway

# ---------------------------------------------------------------- the pieces alone


def test_token_window_counts_one_minute() -> None:
    w = TokenWindow()
    w.add(100, 1000.2)
    w.add(50, 1030.9)
    assert w.used(1030.9) == 150
    assert w.used(1059.9) == 150  # the first bucket (second 1000) is 59 s old: still in
    assert w.used(1060.0) == 50  # now it is 60 s old: out
    assert w.used(1091.0) == 0
    w.add(7, 5000.0)  # a long gap clears everything
    assert w.used(5000.5) == 7


def test_token_window_says_when_it_drops_below_a_limit() -> None:
    w = TokenWindow()
    w.add(80, 100.0)
    w.add(30, 120.0)
    # Under 100 once the 80 leave (at 160); under 20 only once the 30 leave too (at 180).
    assert w.seconds_until_below(100, 130.5) == pytest.approx(29.5)
    assert w.seconds_until_below(20, 130.5) == pytest.approx(49.5)


def test_limits_fall_back_to_defaults_field_by_field() -> None:
    table = LimitTable(Limits(open_sessions=10, in_flight=4, tokens_per_minute=1000))
    table.set_limits("big", Limits(in_flight=64))
    assert table.limits_for("big") == Limits(10, 64, 1000)
    assert table.limits_for("other") == Limits(10, 4, 1000)
    table.replace_overrides({})
    assert table.limits_for("big") == Limits(10, 4, 1000)


def test_in_flight_slots_are_released_on_any_exit() -> None:
    table = LimitTable(Limits(in_flight=2))
    a, b = table.start_turn("t"), table.start_turn("t")
    with pytest.raises(RateLimited) as err:
        table.start_turn("t")
    assert err.value.status == 429 and err.value.code == "too_many_requests_in_flight"
    assert err.value.retry_after == 1
    table.start_turn("other").__exit__(None, None, None)  # another tenant is not affected
    with a:
        pass
    with pytest.raises(ValueError), b:
        raise ValueError("a failed turn")
    assert table.in_flight("t") == 0
    table.start_turn("t").__exit__(None, None, None)


def test_tokens_per_minute_refuses_the_next_turn_with_retry_after() -> None:
    now = [1000.0]
    table = LimitTable(Limits(tokens_per_minute=100), clock=lambda: now[0])
    with table.start_turn("t"):
        table.count_generated("t", 120)  # a turn may cross the limit: its length was not known
    now[0] = 1010.0
    with pytest.raises(RateLimited) as err:
        table.start_turn("t")
    assert err.value.code == "tokens_per_minute_exceeded"
    assert err.value.retry_after == 50  # the 120 tokens leave the window at 1060
    now[0] = 1060.0
    table.start_turn("t").__exit__(None, None, None)


def test_open_sessions_count_drops_closed_sessions() -> None:
    table = LimitTable(Limits(open_sessions=2))
    open_ids = {"s1", "s2"}
    for sid in ("s1", "s2"):
        table.check_session_room("t", open_ids.__contains__)
        table.session_opened("t", sid)
    with pytest.raises(RateLimited) as err:
        table.check_session_room("t", open_ids.__contains__)
    assert err.value.code == "too_many_open_sessions"
    open_ids.discard("s1")  # finished, deleted or expired: nobody has to report it
    table.check_session_room("t", open_ids.__contains__)
    assert table.open_sessions(open_ids.__contains__) == {"t": 1}


def test_a_session_this_process_did_not_open_counts_from_its_first_turn() -> None:
    # A session restored from the journal was never admitted here: its turns count it.
    table = LimitTable(Limits(open_sessions=1))
    with table.start_turn("t", "restored"):
        pass
    assert table.open_sessions(lambda sid: True) == {"t": 1}
    with pytest.raises(RateLimited):
        table.check_session_room("t", lambda sid: True)


# ---------------------------------------------------------------- over HTTP, a real gateway

KEYS = "team-a:key-a-0123456789,team-b:key-b-0123456789"
A = {"Authorization": "Bearer key-a-0123456789"}
B = {"Authorization": "Bearer key-b-0123456789"}
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def fe(tiny_qwen3: Path) -> Iterator[FaultEngine]:
    with fault_engine(tiny_qwen3) as engine:
        yield engine


@pytest.fixture(scope="module")
def gw(fe: FaultEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    args = ["--max-open-sessions", "2", "--max-in-flight", "1", "--max-tokens-per-minute", "1000000"]
    with gateway(fe.url, tmp_path_factory.mktemp("limits"), *args, env={"RLGW_TENANT_KEYS": KEYS}) as g:
        yield g


@pytest.fixture(autouse=True)
def _reset(fe: FaultEngine) -> None:
    fe.script.clear()
    fe.calls.clear()


def _session(gw: Gateway, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(gw.url + "/v1/sessions", json={"task_id": "t"}, headers=headers)


def _client(s: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)


def _assert_429(r: httpx.Response, code: str) -> None:
    assert r.status_code == 429, r.text
    assert r.json()["error"]["type"] == "rate_limit_exceeded"
    assert r.json()["error"]["code"] == code
    assert int(r.headers["retry-after"]) >= 1


def test_open_sessions_limit_is_a_429_until_one_finishes(gw: Gateway) -> None:
    first = _session(gw, A).json()
    second = _session(gw, A).json()
    _assert_429(_session(gw, A), "too_many_open_sessions")
    assert _session(gw, B).status_code == 200  # another tenant has its own count
    r = httpx.post(gw.url + f"/v1/sessions/{first['session_id']}/finish", json={}, headers=A)
    assert r.status_code == 200
    third = _session(gw, A)
    assert third.status_code == 200
    for s in (second, third.json()):
        httpx.delete(gw.url + f"/v1/sessions/{s['session_id']}", headers=A)


def test_in_flight_limit_refuses_a_second_concurrent_turn(gw: Gateway, fe: FaultEngine) -> None:
    s1, s2 = _session(gw, A).json(), _session(gw, A).json()
    fe.script.append("slow")  # the first turn holds the tenant's only slot for 3 s
    results: list[Any] = []
    slow = threading.Thread(
        target=lambda: results.append(_client(s1).chat.completions.create(model="m", messages=USER))
    )
    slow.start()
    deadline = time.monotonic() + 10
    while not fe.calls and time.monotonic() < deadline:
        time.sleep(0.02)
    with pytest.raises(openai.RateLimitError) as err:  # what an OpenAI SDK user sees
        _client(s2).chat.completions.create(model="m", messages=USER)
    assert err.value.status_code == 429
    assert err.value.response.headers["retry-after"] == "1"
    assert err.value.body["code"] == "too_many_requests_in_flight"
    slow.join(timeout=15)
    assert results and results[0].choices[0].message is not None
    # The slot is free again, and the refused turn left its session untouched.
    assert _client(s2).chat.completions.create(model="m", messages=USER).choices
    doc = httpx.get(gw.url + f"/v1/sessions/{s2['session_id']}", headers=A).json()
    assert doc["turns"] == 1
    for s in (s1, s2):
        httpx.delete(gw.url + f"/v1/sessions/{s['session_id']}", headers=A)


def test_tokens_per_minute_from_a_tenants_own_limits(
    fe: FaultEngine, tmp_path_factory: pytest.TempPathFactory
) -> None:
    admin = {"Authorization": "Bearer admin-0123456789"}
    tmp = tmp_path_factory.mktemp("tpm")
    with gateway(fe.url, tmp, env={"RLGW_ADMIN_KEY": "admin-0123456789"}) as g:
        r = httpx.post(
            g.url + "/admin/tenants",
            json={"name": "small", "limits": {"tokens_per_minute": 1}},
            headers=admin,
        )
        assert r.status_code == 201, r.text
        key = {"Authorization": f"Bearer {r.json()['api_key']}"}
        s = _session(g, key).json()
        url = s["base_url"] + "/chat/completions"
        auth = {"Authorization": f"Bearer {s['api_key']}"}
        assert httpx.post(url, json={"messages": USER}, headers=auth).status_code == 200
        refused = httpx.post(url, json={"messages": USER}, headers=auth)
        _assert_429(refused, "tokens_per_minute_exceeded")
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        # Refused before it ran: the session has one turn and no failed one from the 429.
        doc = httpx.get(g.url + f"/v1/sessions/{s['session_id']}", headers=key).json()
        assert doc["turns"] == 1
