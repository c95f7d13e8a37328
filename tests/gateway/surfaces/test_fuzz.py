"""Bad input and abuse: the request caps, the context cap, and a schema-driven fuzz of every route.

The gateway and its engine run for real over HTTP in this process's threads. The engine is the
instant stub (`bench/stub_engine.py`: SGLang's `/generate` protocol, real tokenizer, no model):
the fuzz is about the gateway's handling of what it is sent, and with the embedded engine each
accepted turn would cost a CPU generation, so a bounded run would reach far fewer requests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from bench.stub_engine import build_app as build_stub_engine
from rlgw.gateway.app import TURN_BODIES, GatewayConfig, create_app, openapi_document
from rlgw.gateway.http.body_limits import RequestCaps
from tests.support.procs import serve_in_thread

TENANT_KEY = "fuzz-tenant-key-0123456789"
ADMIN_KEY = "fuzz-admin-key-0123456789"
CONTEXT = 2048
VOCAB = 4096  # tiny-qwen3's config.vocab_size (its tokenizer: 4026 ids, the rest padded)
CAPS = RequestCaps(max_body_bytes=256 * 1024, max_messages=64, max_tools=8)


@pytest.fixture(scope="module")
def gw(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = GatewayConfig(
        engine_url="",
        data_dir=tmp_path_factory.mktemp("fuzz"),
        tenant_keys={TENANT_KEY: "fuzz"},
        admin_key=ADMIN_KEY,
        engine_wait=30,
        request_caps=CAPS,
    )
    with serve_in_thread(build_stub_engine(str(tiny_qwen3), CONTEXT)) as engine_url:
        config.engine_url = engine_url
        with serve_in_thread(create_app(config)) as url:
            yield url


@pytest.fixture(scope="module")
def session(gw: str) -> dict[str, Any]:
    r = httpx.post(gw + "/v1/sessions", json={"task_id": "fuzz"}, headers=_bearer(TENANT_KEY))
    assert r.status_code == 200, r.text
    return r.json()


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _turn(s: dict[str, Any], body: dict[str, Any] | None = None, **kw: Any) -> httpx.Response:
    body = body or {"messages": [{"role": "user", "content": "list the files"}]}
    return httpx.post(s["base_url"] + "/chat/completions", json=body, headers=_bearer(s["api_key"]), **kw)


# ---------------------------------------------------------------- caps


def test_a_body_over_the_cap_is_a_413_before_it_is_read(gw: str, session: dict[str, Any]) -> None:
    big = {"messages": [{"role": "user", "content": "x" * (CAPS.max_body_bytes or 0)}]}
    r = _turn(session, big)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"


def test_a_chunked_body_over_the_cap_is_a_413(gw: str, session: dict[str, Any]) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(64):
            yield b"x" * 8192
        yield b'"}]}'

    r = httpx.post(
        session["base_url"] + "/chat/completions",
        content=chunks(),
        headers={**_bearer(session["api_key"]), "content-type": "application/json"},
    )
    assert r.status_code == 413
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_too_many_messages_or_tools_is_a_400_naming_the_param(gw: str, session: dict[str, Any]) -> None:
    many = [{"role": "user", "content": str(i)} for i in range((CAPS.max_messages or 0) + 1)]
    r = _turn(session, {"messages": many})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    r = _turn(session, {"messages": many[:1], "tools": [tool] * ((CAPS.max_tools or 0) + 1)})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
    r = httpx.post(
        session["base_url"] + "/responses", json={"input": many}, headers=_bearer(session["api_key"])
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"


def test_a_prompt_over_the_models_context_is_refused_and_changes_nothing(
    gw: str, session: dict[str, Any]
) -> None:
    # The per-session cap on ledger tokens is the model's context: a turn that would overflow it
    # is a 400 `context_length_exceeded`, and the session goes on.
    before = httpx.get(gw + f"/v1/sessions/{session['session_id']}", headers=_bearer(TENANT_KEY)).json()
    long = [{"role": "user", "content": "word " * (CONTEXT + 100)}]
    r = _turn(session, {"messages": long})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    after = httpx.get(gw + f"/v1/sessions/{session['session_id']}", headers=_bearer(TENANT_KEY)).json()
    assert after["tokens"] == before["tokens"]


# Defects the fuzz found in other areas (fixed): prompt ids outside the vocabulary, an empty ids
# prompt, and cursors past int64 are 400s/404s, not samples rejected at finish or 500s.


@pytest.mark.parametrize("bad_id", [VOCAB, 2**40, -1])
def test_completions_refuses_token_ids_outside_the_vocabulary(gw: str, bad_id: int) -> None:
    s = httpx.post(gw + "/v1/sessions", json={"task_id": "ids"}, headers=_bearer(TENANT_KEY)).json()
    r = httpx.post(
        s["base_url"] + "/completions",
        json={"prompt": [1, 2, bad_id], "max_tokens": 4},
        headers=_bearer(s["api_key"]),
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_completions_refuses_an_empty_ids_prompt(gw: str) -> None:
    s = httpx.post(gw + "/v1/sessions", json={"task_id": "ids"}, headers=_bearer(TENANT_KEY)).json()
    r = httpx.post(
        s["base_url"] + "/completions", json={"prompt": [], "max_tokens": 4}, headers=_bearer(s["api_key"])
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_viewer_refuses_a_cursor_past_int64(gw: str) -> None:
    r = httpx.get(gw + f"/ui/runs/{2**70}", headers=_bearer(TENANT_KEY))
    assert r.status_code in (400, 404)


# ---------------------------------------------------------------- the fuzz


def _document(gw: str) -> dict[str, Any]:
    return openapi_document(httpx.get(gw + "/openapi.json").json())


def _credentials(path: str, s: dict[str, Any]) -> dict[str, str]:
    if path.startswith("/admin") or path == "/metrics":
        return _bearer(ADMIN_KEY)
    if path.startswith("/v1/") and path in TURN_BODIES:
        return _bearer(s["api_key"])  # routes that find the session by its key
    return _bearer(TENANT_KEY)


def test_fuzz_finds_no_5xx_and_leaves_sessions_usable(gw: str, session: dict[str, Any]) -> None:
    schema = schemathesis.openapi.from_dict(_document(gw))
    seen: dict[str, set[int]] = {}

    @settings(
        max_examples=250,
        deadline=None,
        derandomize=True,  # the same cases every run: a CI failure reproduces
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(case=schema.as_strategy())
    def one_call(case: schemathesis.Case) -> None:
        path = case.operation.path
        aimed = path.startswith("/s/{session_id}") or (case.method == "GET" and "{session_id}" in path)
        if aimed and case.path_parameters:
            # Aim turns at the live session; finish and delete keep their random ids so the
            # session survives the run.
            case.path_parameters["session_id"] = session["session_id"]
        if case.query and "wait" in case.query:
            case.query["wait"] = "0"  # a long poll only waits; bounded here to keep the run short
        response = case.call(base_url=gw, headers=_credentials(path, session), timeout=30)
        seen.setdefault(f"{case.method} {path}", set()).add(response.status_code)
        assert response.status_code < 500, (
            f"{case.method} {path}: {response.status_code} {response.text[:500]}"
        )

    one_call()
    assert len(seen) >= 15  # most operations were reached
    # Every session is still usable: a normal turn on the fuzzed session works, and its ledger
    # becomes valid samples.
    r = _turn(session)
    assert r.status_code == 200, r.text
    done = httpx.post(
        gw + f"/v1/sessions/{session['session_id']}/finish", json={"reward": 1.0}, headers=_bearer(TENANT_KEY)
    )
    assert done.status_code == 200, done.text
    assert done.json()["samples"] and not done.json()["rejects"]
    print(sorted((k, sorted(v)) for k, v in seen.items()))  # shown with -s: what the run reached
