"""The viewer on the real gateway: a tool conversation recorded through `create_app` (embedded engine on
tiny-qwen3, real Qwen3 template, the `openai` SDK as the agent) shows up at /ui under tenant keys.

The app is the gateway's own; the viewer's router is mounted on it here only if `create_app` does not
mount it yet (the gateway's app module includes it once the two land together)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from rlgw.gateway.app import GatewayConfig, create_app
from rlgw.gateway.viewer import routes as viewer
from tests.support import fixture_prompts as fp
from tests.support.procs import engine_server, serve_in_thread

KEYS = {"key-alice": "alice", "key-bob": "bob"}
ALICE = {"Authorization": "Bearer key-alice"}
BOB = {"Authorization": "Bearer key-bob"}


@pytest.fixture(scope="module")
def gateway(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = GatewayConfig(engine_url="", data_dir=tmp_path_factory.mktemp("gw-store"), tenant_keys=KEYS)
    with engine_server(tiny_qwen3) as engine:
        config.engine_url = engine
        app = create_app(config)
        if not any(getattr(r, "path", "").startswith("/ui") for r in app.routes):
            app.include_router(viewer.router)
        with serve_in_thread(app) as url:
            yield url


def _record(gw: str, headers: dict[str, str], task: str) -> dict[str, Any]:
    """One tool call, its result, the answer; finished with a reward. Returns the finish summary."""
    session = httpx.post(gw + "/v1/sessions", json={"task_id": task}, headers=headers).json()
    agent = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"])
    messages: list[dict] = list(fp.WEATHER)
    for _ in range(3):
        reply = agent.chat.completions.create(
            model="m", messages=messages, tools=fp.TOOLS, temperature=0, max_tokens=120
        )
        msg = reply.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            break
        for call in msg.tool_calls:
            city = json.loads(call.function.arguments)["city"]
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": fp.weather_result(city, "sunny", 21)}
            )
    finish = httpx.post(
        f"{gw}/v1/sessions/{session['session_id']}/finish",
        json={"reward": 0.5, "termination_reason": "agent_done"},
        headers=headers,
    )
    return finish.json()


@pytest.mark.slow
def test_a_recorded_tool_run_shows_in_its_tenants_viewer_only(gateway: str) -> None:
    alice = _record(gateway, ALICE, "weather-alice")
    bob = _record(gateway, BOB, "weather-bob")
    cursor = alice["samples"][0]["cursor"]

    listing = httpx.get(gateway + "/ui", headers=ALICE).text
    assert f'href="/ui/runs/{cursor}"' in listing and "weather-alice" in listing
    assert "weather-bob" not in listing
    run = httpx.get(f"{gateway}/ui/runs/{cursor}", headers=ALICE).text
    assert re.search(r"get_weather\(\{&#34;city&#34;: &#34;\w+&#34;\}\)", run)  # the parsed call
    assert "agent_done" in run
    page = httpx.get(
        f"{gateway}/ui/api/samples/{cursor}/tokens", params={"count": 8192}, headers=ALICE
    ).json()
    kinds = set(page["kind"])
    assert {0, 1, 2, 3} <= kinds  # prompt, sampled, tool output and template tokens all present
    assert sum(k == 1 for k in page["kind"]) == alice["trainable_tokens"]

    bob_cursor = bob["samples"][0]["cursor"]
    assert httpx.get(f"{gateway}/ui/runs/{bob_cursor}", headers=ALICE).status_code == 404
    assert httpx.get(f"{gateway}/ui/api/samples/{bob_cursor}/tokens", headers=ALICE).status_code == 404
    assert httpx.get(gateway + "/ui").status_code == 401
