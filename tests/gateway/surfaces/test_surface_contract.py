"""The Messages, Responses and Gemini surfaces' HTTP contract with a scripted engine (tenant keys on).

Auth by Anthropic's `x-api-key` and Gemini's `x-goog-api-key` (a session's key or its tenant's), errors
in each surface's format before and after the first byte, and a failed turn that records nothing.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from tests.gateway.test_api import A, info, session
from tests.support.fault_engine import FaultEngine

HI = {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(autouse=True)
def _reset(fe: FaultEngine) -> None:
    fe.script.clear()


def sse_events(text: str) -> list[dict[str, Any]]:
    """The `data:` documents of an SSE body, with each event's name checked against its type."""
    out = []
    for block in text.strip().split("\n\n"):
        name, data = block.split("\n", 1)
        doc = orjson.loads(data.removeprefix("data: "))
        assert name == "event: " + doc["type"]
        out.append(doc)
    return out


def test_messages_take_a_session_or_tenant_key_in_x_api_key(gw: str) -> None:
    s = session(gw)
    r = httpx.post(gw + "/v1/messages", json=HI, headers={"x-api-key": s["api_key"]})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["content"] == [{"type": "text", "text": "Hello there."}] and doc["stop_reason"] == "end_turn"
    r = httpx.post(s["base_url"] + "/messages", json=HI, headers={"x-api-key": "key-a-0123456789"})
    assert r.status_code == 200, r.text
    r = httpx.post(s["base_url"] + "/messages", json=HI)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(gw + "/s/nope/v1/messages", json=HI, headers=A)
    assert r.status_code == 404 and r.json() == {
        "type": "error",
        "error": {"type": "not_found_error", "message": r.json()["error"]["message"]},
    }


def test_messages_errors_before_the_first_byte_are_anthropic_errors(gw: str, fe: FaultEngine) -> None:
    s = session(gw)
    url, key = s["base_url"] + "/messages", {"x-api-key": s["api_key"]}
    r = httpx.post(url, json={**HI, "max_tokens": 1000}, headers=key)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert r.json()["error"]["message"].startswith(
        "input length and `max_tokens` exceed context limit: 9 + 1000 > 256"
    )
    r = httpx.post(url, content=b"{nope", headers=key)
    assert r.status_code == 400 and r.json()["type"] == "error"
    r = httpx.post(url, json={**HI, "temperature": 3}, headers=key)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("temperature")
    fe.script.append("500")
    r = httpx.post(url, json=HI, headers=key)
    assert r.status_code == 502 and r.json()["error"]["type"] == "api_error"
    fe.script.extend(["503"] * 4)  # the engine client's retries, then the answer
    r = httpx.post(url, json=HI, headers=key)
    assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"
    assert info(gw, s["session_id"])["tokens"] == 0


def _streamed(gw: str, fe: FaultEngine, path: str, body: dict, fault: str) -> tuple[dict, httpx.Response]:
    """A new session's streamed turn on `path` whose engine call meets `fault`."""
    s = session(gw)
    fe.script.append(fault)
    r = httpx.post(s["base_url"] + path, json=body, headers={"Authorization": f"Bearer {s['api_key']}"})
    return s, r


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/messages", {**HI, "stream": True}),
        ("/responses", {"input": "hi", "stream": True}),
        ("/chat/completions", {**HI, "stream": True}),
    ],
)
def test_a_stream_whose_engine_fails_before_the_first_token_is_a_status(
    gw: str, fe: FaultEngine, path: str, body: dict
) -> None:
    # The head goes out only once the engine answered: the SDKs retry a 5xx, not an in-stream error.
    s, r = _streamed(gw, fe, path, body, "500")
    assert r.status_code == 502 and "text/event-stream" not in r.headers["content-type"]
    assert info(gw, s["session_id"])["tokens"] == 0


@pytest.mark.parametrize(
    ("path", "body"), [("/messages", {**HI, "stream": True}), ("/responses", {"input": "hi", "stream": True})]
)
def test_an_engine_failure_mid_stream_is_an_error_event_and_records_nothing(
    gw: str, fe: FaultEngine, path: str, body: dict
) -> None:
    s, r = _streamed(gw, fe, path, body, "drop")
    assert r.status_code == 200
    events = sse_events(r.text)
    kinds = [e["type"] for e in events]
    assert kinds[0] in ("message_start", "response.created") and "error" in kinds
    assert kinds[-1] == ("error" if path == "/messages" else "response.failed")
    assert info(gw, s["session_id"])["tokens"] == 0


def test_responses_errors_are_openai_errors(gw: str) -> None:
    s = session(gw)
    auth = {"Authorization": f"Bearer {s['api_key']}"}
    r = httpx.post(s["base_url"] + "/responses", json={"instructions": "no input"}, headers=auth)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    r = httpx.post(
        s["base_url"] + "/responses", json={"input": "hi", "max_output_tokens": 1000}, headers=auth
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = httpx.post(s["base_url"] + "/responses", json={"input": "hi"}, headers=auth)
    assert r.status_code == 200 and r.json()["output"][0]["content"][0]["text"] == "Hello there."


GEMINI_HI = {
    "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
    "generationConfig": {"maxOutputTokens": 8},
}
GENERATE = "/v1beta/models/tiny:generateContent"
STREAM = "/v1beta/models/tiny:streamGenerateContent?alt=sse"


def gemini_status(r: httpx.Response, code: int, status: str) -> None:
    assert r.status_code == code, r.text
    assert r.json()["error"]["code"] == code and r.json()["error"]["status"] == status


def test_gemini_takes_a_session_or_tenant_key_in_x_goog_api_key(gw: str) -> None:
    s = session(gw)
    root = s["base_url"].removesuffix("/v1")
    r = httpx.post(gw + GENERATE, json=GEMINI_HI, headers={"x-goog-api-key": s["api_key"]})
    assert r.status_code == 200, r.text
    candidate = r.json()["candidates"][0]
    assert candidate["content"] == {"role": "model", "parts": [{"text": "Hello there."}]}
    assert candidate["finishReason"] == "STOP"
    r = httpx.post(root + GENERATE, json=GEMINI_HI, headers={"x-goog-api-key": "key-a-0123456789"})
    assert r.status_code == 200, r.text
    gemini_status(httpx.post(root + GENERATE, json=GEMINI_HI), 401, "UNAUTHENTICATED")
    gemini_status(httpx.post(gw + "/s/nope" + GENERATE, json=GEMINI_HI, headers=A), 404, "NOT_FOUND")


def test_gemini_engine_failures_are_gemini_errors_and_record_nothing(gw: str, fe: FaultEngine) -> None:
    s = session(gw)
    url, key = s["base_url"].removesuffix("/v1") + GENERATE, {"x-goog-api-key": s["api_key"]}
    fe.script.append("500")
    gemini_status(httpx.post(url, json=GEMINI_HI, headers=key), 502, "INTERNAL")
    fe.script.extend(["503"] * 4)  # the engine client's retries, then the answer
    gemini_status(httpx.post(url, json=GEMINI_HI, headers=key), 503, "UNAVAILABLE")
    assert info(gw, s["session_id"])["tokens"] == 0


def test_a_gemini_stream_fails_with_a_status_before_the_first_token_and_an_event_after(
    gw: str, fe: FaultEngine
) -> None:
    s, r = _streamed(gw, fe, STREAM.replace("/v1beta", ""), GEMINI_HI, "500")
    assert r.status_code == 502 and r.json()["error"]["status"] == "INTERNAL"
    s, r = _streamed(gw, fe, STREAM.replace("/v1beta", ""), GEMINI_HI, "drop")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    chunks = [orjson.loads(block.removeprefix("data: ")) for block in r.text.strip().split("\n\n")]
    assert "candidates" in chunks[0] and chunks[-1]["error"]["code"] >= 500
    assert info(gw, s["session_id"])["tokens"] == 0


def test_only_geminis_routes_take_a_key_in_the_query(gw: str) -> None:
    # Gemini's clients may send `?key=`; nowhere else may a key travel in a URL (a proxy's logs keep URLs).
    root = session(gw)["base_url"].removesuffix("/v1")
    r = httpx.post(root + GENERATE, params={"key": "key-a-0123456789"}, json=GEMINI_HI)
    assert r.status_code == 200, r.text
    body = {"task_id": "query-key"}
    assert httpx.post(gw + "/v1/sessions", params={"key": "key-a-0123456789"}, json=body).status_code == 401
    assert httpx.post(gw + "/v1/sessions", headers=A, json=body).status_code == 200
