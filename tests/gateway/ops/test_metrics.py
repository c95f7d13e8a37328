"""Prometheus metrics: the meter's split of a turn's time, then `/metrics` of a real gateway."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from rlgw.gateway import metrics
from rlgw.gateway.serving.edge import Edge
from rlgw.gateway.tenancy.limits import LimitTable
from tests.support.fault_engine import FaultEngine, fault_engine
from tests.support.gateway_proc import Gateway, gateway

ENGINE_S = 0.05


class SlowEngine:
    """A backend whose every wait is `ENGINE_S` long (what `MeteredBackend` must count)."""

    async def generate(self, *args: Any, **kwargs: Any) -> str:
        await asyncio.sleep(ENGINE_S)
        return "result"

    async def stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[int]:
        for i in range(3):
            await asyncio.sleep(ENGINE_S)
            yield i

    def describe(self) -> str:
        return "slow"


def _sample(name: str, **labels: str) -> float:
    value = metrics.REGISTRY.get_sample_value(name, labels or None)
    return value or 0.0


async def test_meter_splits_a_turn_into_engine_and_gateway_time() -> None:
    backend = metrics.MeteredBackend(SlowEngine())
    assert backend.describe() == "slow"  # everything else is the wrapped backend's

    async def turn(request: Request) -> PlainTextResponse:
        await backend.generate([1, 2], {})
        got = [u async for u in backend.stream([1, 2], {})]
        assert got == [0, 1, 2]
        metrics.turn_generated("unit", 5)
        return PlainTextResponse("ok")

    async def not_a_turn(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    plain = Starlette(routes=[Route("/turn", turn), Route("/plain", not_a_turn)])
    app = Edge(plain, table=LimitTable(), max_body_bytes=None, routes={})
    before_engine = _sample("rlgw_engine_seconds_sum")
    before_turns = _sample("rlgw_turn_added_seconds_count", surface="unit")
    before_req = _sample("rlgw_requests_total", route="/turn", method="GET", status="200")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        assert (await client.get("/turn")).status_code == 200
        assert (await client.get("/plain")).status_code == 200
        assert (await client.get("/nowhere")).status_code == 404
    # Four engine waits of ENGINE_S each (one generate, three stream updates) count as the engine's.
    assert _sample("rlgw_engine_seconds_sum") - before_engine >= 4 * ENGINE_S
    assert _sample("rlgw_turn_added_seconds_count", surface="unit") - before_turns == 1
    assert _sample("rlgw_requests_total", route="/turn", method="GET", status="200") - before_req == 1
    # Paths are labelled by route template; unknown paths share one label.
    assert _sample("rlgw_requests_total", route="unmatched", method="GET", status="404") >= 1


def test_every_documented_metric_is_exported() -> None:
    text = metrics.exposition()[0].decode()
    for name in (
        "rlgw_requests",
        "rlgw_request_seconds",
        "rlgw_turn_added_seconds",
        "rlgw_engine_seconds",
        "rlgw_recorded_tokens",
        "rlgw_trainable_tokens",
        "rlgw_generated_tokens",
        "rlgw_segments",
        "rlgw_conversations",
        "rlgw_sample_rejects",
        "rlgw_request_rejects",
        "rlgw_engine_errors",
        "rlgw_journal_write_seconds",
        "rlgw_turns_in_flight",
    ):
        assert f"# HELP {name}" in text, name
        assert f"`{name.removeprefix('rlgw_')}" in (metrics.__doc__ or ""), name  # documented too


# ---------------------------------------------------------------- a real gateway's /metrics

KEYS = "team-a:key-a-0123456789"
A = {"Authorization": "Bearer key-a-0123456789"}
ADMIN = {"Authorization": "Bearer admin-key-0123456789"}
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def fe(tiny_qwen3: Path) -> Iterator[FaultEngine]:
    with fault_engine(tiny_qwen3) as engine:
        yield engine


@pytest.fixture(scope="module")
def gw(fe: FaultEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    env = {"RLGW_TENANT_KEYS": KEYS, "RLGW_ADMIN_KEY": "admin-key-0123456789"}
    with gateway(fe.url, tmp_path_factory.mktemp("metrics"), "--max-body-bytes", "65536", env=env) as g:
        yield g


def _scrape(gw: Gateway) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = httpx.get(gw.url + "/metrics", headers=ADMIN)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(scrape: dict, name: str, **labels: str) -> float:
    return scrape.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_need_the_admin_key_when_one_is_set(gw: Gateway) -> None:
    assert httpx.get(gw.url + "/metrics").status_code == 401
    assert httpx.get(gw.url + "/metrics", headers=A).status_code == 401


def test_turns_tokens_sessions_and_failures_are_counted(gw: Gateway, fe: FaultEngine) -> None:
    before = _scrape(gw)
    s = httpx.post(gw.url + "/v1/sessions", json={"task_id": "t"}, headers=A).json()
    url, auth = s["base_url"] + "/chat/completions", {"Authorization": f"Bearer {s['api_key']}"}
    assert httpx.post(url, json={"messages": USER}, headers=auth).status_code == 200
    fe.script.append("500")
    failed = httpx.post(url, json={"messages": [*USER, {"role": "user", "content": "again"}]}, headers=auth)
    assert failed.status_code >= 500
    big = httpx.post(url, content=b"x" * 70000, headers={**auth, "content-type": "application/json"})
    assert big.status_code == 413
    after = _scrape(gw)

    def delta(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    route = "/s/{session_id}/v1/chat/completions"
    assert delta("rlgw_requests_total", route=route, method="POST", status="200") == 1
    assert delta("rlgw_turn_added_seconds_count", surface="chat") == 1
    assert delta("rlgw_engine_seconds_count") == 1
    generated = delta("rlgw_generated_tokens_total")
    assert generated == len(fe.reply)
    assert delta("rlgw_trainable_tokens_total") == generated
    assert delta("rlgw_recorded_tokens_total") > generated  # the prompt increment is recorded too
    assert delta("rlgw_engine_errors_total", kind="upstream_error") == 1
    assert delta("rlgw_request_rejects_total", reason="body_too_large") == 1
    assert _value(after, "rlgw_open_sessions", tenant="team-a") >= 1
    httpx.post(gw.url + f"/v1/sessions/{s['session_id']}/finish", json={}, headers=A)
    assert (
        _value(_scrape(gw), "rlgw_open_sessions", tenant="team-a")
        == _value(after, "rlgw_open_sessions", tenant="team-a") - 1
    )
