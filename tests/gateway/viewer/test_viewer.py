"""The trajectory viewer over HTTP: run list, filters, one run's page, token pages, tenant scoping.

Real store (SQLite), real tiny-qwen3 tokenizer, the real router mounted as the gateway mounts it;
browser checks are in test_viewer_browser.py.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from transformers import AutoTokenizer

from rlgw.gateway.http.errors import install_error_handlers
from rlgw.gateway.sample import Sample, SampleStatus
from rlgw.gateway.tenancy.tenants import KeyTable
from rlgw.gateway.trajectories.store import TrajectoryStore
from rlgw.gateway.viewer import routes as viewer
from tests.support.viewer_samples import tool_conversation

KEYS = {"key-alice": "alice", "key-bob": "bob"}


@pytest.fixture(scope="module")
def tok(tiny_qwen3: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_qwen3)


@pytest.fixture(scope="module")
def filled(tok: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """alice: a two-segment tool run (the second truncated, with a parse error) and a one-segment run;
    bob: one run."""
    data = tmp_path_factory.mktemp("viewer-store")
    rng = np.random.default_rng(1)
    first = tool_conversation(tok, rng, repeats=2, metadata={"segments": 2})
    second = tool_conversation(
        tok,
        rng,
        metadata={
            "segment": 1,
            "segment_cause": "compaction",
            "segment_cause_detail": "the agent summarized its history",
            "segments": 2,
            "tool_parse_errors": [
                {"turn": 0, "kind": "invalid_json", "detail": "Expecting value", "raw": "<tool_call>{"}
            ],
        },
    )
    second.status = SampleStatus.TRUNCATED
    other = tool_conversation(tok, rng, metadata={"termination_reason": "max_turns"})
    bobs = tool_conversation(tok, rng)

    async def fill() -> dict[str, Any]:
        store = TrajectoryStore.open(data)
        run = await store.add_samples("alice", "sess-weather", "weather-paris", [first, second])
        short = await store.add_samples("alice", "sess-short", "weather-short", [other])
        bob = await store.add_samples("bob", "sess-bob", "bobs-secret-task", [bobs])
        await store.close()
        return {"run": run, "short": short[0], "bob": bob[0], "samples": {run[0]: first, run[1]: second}}

    return data, asyncio.run(fill())


def _keyed_app(store: TrajectoryStore, tok: Any) -> FastAPI:
    """The router as the gateway mounts it: tenant keys in `app.state.tenant_keys`, which the viewer
    shares."""
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(viewer.router)
    app.state.tenant_keys = KeyTable()
    for key, tenant in KEYS.items():
        app.state.tenant_keys.add(key, tenant)
    app.state.viewer = viewer.ViewerState(store, app.state.tenant_keys, tok, viewer.tool_format_of(tok))
    return app


@pytest.fixture
async def offline(filled, tok) -> Any:
    store = TrajectoryStore.open_readonly(filled[0])
    app = viewer.viewer_app(store, tokenizer=tok)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        yield c
    await store.close()


@pytest.fixture
async def keyed(filled, tok) -> Any:
    store = TrajectoryStore.open_readonly(filled[0])
    app = _keyed_app(store, tok)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        yield c
    await store.close()


def _rows(html: str) -> list[list[str]]:
    rows = re.findall(r"<tr data-cursor=\"\d+\">(.*?)</tr>", html, re.DOTALL)
    return [
        [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.DOTALL)]
        for r in rows
    ]


async def test_run_list_shows_runs_newest_first(offline, filled) -> None:
    _, ids = filled
    resp = await offline.get("/ui")
    assert resp.status_code == 200
    rows = _rows(resp.text)
    assert [r[0] for r in rows] == ["bobs-secret-task", "weather-short", "weather-paris"]
    _task, mode, reward, status, segments, trainable, reason, versions = rows[2][:8]
    samples: dict[int, Sample] = ids["samples"]
    assert (mode, reward, status, segments) == ("capture", "1", "completed, truncated", "2")
    assert int(trainable) == sum(int(s.loss_mask.sum()) for s in samples.values())
    assert (reason, versions) == ("agent_done", "v1")
    assert f'href="/ui/runs/{ids["run"][0]}"' in resp.text


async def test_run_list_filters(offline) -> None:
    by_task = _rows((await offline.get("/ui", params={"task": "WEATHER"})).text)
    assert [r[0] for r in by_task] == ["weather-short", "weather-paris"]
    truncated = _rows((await offline.get("/ui", params={"status": "truncated"})).text)
    assert [r[0] for r in truncated] == ["weather-paris"]
    by_reason = _rows((await offline.get("/ui", params={"reason": "max_t"})).text)
    assert [r[0] for r in by_reason] == ["weather-short"]
    assert "match these filters" in (await offline.get("/ui", params={"task": "nope"})).text


async def test_run_list_pages_split_no_run(offline, filled, monkeypatch) -> None:
    """With one-row store reads and one run per page, a two-segment run still shows as one run."""
    monkeypatch.setattr(viewer, "SCAN_ROWS", 1)
    monkeypatch.setattr(viewer, "RUNS_PER_PAGE", 1)
    seen, url = [], "/ui"
    while url:
        html = (await offline.get(url)).text
        seen += [(r[0], r[4]) for r in _rows(html)]
        more = re.search(r'<a href="([^"]+)">older runs', html)
        url = more.group(1).replace("&amp;", "&") if more else ""
    assert seen == [("bobs-secret-task", "1"), ("weather-short", "1"), ("weather-paris", "2")]


async def test_run_page_shows_segments_turns_calls_and_errors(offline, filled) -> None:
    _, ids = filled
    html = (await offline.get(f"/ui/runs/{ids['run'][0]}")).text
    assert html.count('<section class="segment"') == 2
    assert "compaction" in html and "the agent summarized its history" in html
    assert html.count("get_weather({&#34;city&#34;: &#34;Paris&#34;})") == 3  # two calls + one in segment 1
    assert "invalid_json" in html and "Expecting value" in html
    assert "tool_calls" in html and "rid-2" in html
    for cursor in ids["run"]:
        assert f'data-cursor="{cursor}"' in html


async def test_token_pages_match_the_sample(offline, filled, tok) -> None:
    _, ids = filled
    cursor = ids["run"][0]
    sample: Sample = ids["samples"][cursor]
    pages, start = [], 0
    while True:
        page = (
            await offline.get(f"/ui/api/samples/{cursor}/tokens", params={"start": start, "count": 40})
        ).json()
        pages.append(page)
        start += len(page["text"])
        if start >= page["total"]:
            break
    kinds = [k for p in pages for k in p["kind"]]
    lps = [x for p in pages for x in p["lp"]]
    texts = [t for p in pages for t in p["text"]]
    assert len(kinds) == len(sample.tokens) and len(pages) > 1
    mask = np.concatenate([np.zeros(sample.prompt_length, np.uint8), sample.loss_mask])
    assert [k == 1 for k in kinds] == [bool(m) for m in mask]
    resp_lp = sample.rollout_log_probs
    got = np.asarray([x for x, m in zip(lps[sample.prompt_length :], sample.loss_mask, strict=True) if m])
    np.testing.assert_allclose(got, resp_lp[sample.loss_mask == 1], atol=1e-4)
    assert all(x is None for x, m in zip(lps, mask, strict=True) if not m)
    assert "".join(texts) == tok.decode(sample.tokens)
    # Tool output is what lies between <tool_response> markers; role headers and markers are template.
    text_of = {"tool": "", "template": ""}
    for t, k in zip(texts, kinds, strict=True):
        if k == 2:
            text_of["tool"] += t
        elif k == 3:
            text_of["template"] += t
    assert text_of["tool"] == '\n{"temperature": 21, "sky": "clear"}\n' * 2
    assert "<tool_response>" in text_of["template"] and "<|im_start|>" in text_of["template"]


async def test_token_api_rejects_bad_ranges(offline, filled) -> None:
    cursor = filled[1]["short"]
    bad = await offline.get(f"/ui/api/samples/{cursor}/tokens", params={"count": 0})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "count"
    assert (await offline.get("/ui/api/samples/99999/tokens")).status_code == 404
    assert (await offline.get("/ui/runs/99999")).status_code == 404
    assert (await offline.get("/ui/static/..%2Fviewer.py")).status_code == 404
    assert (await offline.get("/ui/static/viewer.js")).status_code == 200


async def test_tenant_sees_only_its_runs(keyed, filled) -> None:
    _, ids = filled
    anonymous = await keyed.get("/ui")
    assert anonymous.status_code == 401 and 'name="key"' in anonymous.text
    assert (await keyed.get(f"/ui/api/samples/{ids['short']}/tokens")).status_code == 401
    alice = {"Authorization": "Bearer key-alice"}
    html = (await keyed.get("/ui", headers=alice)).text
    assert [r[0] for r in _rows(html)] == ["weather-short", "weather-paris"]
    assert "bobs-secret-task" not in html
    bob_run = await keyed.get(f"/ui/runs/{ids['bob']}", headers=alice)
    assert bob_run.status_code == 404 and "bobs-secret-task" not in bob_run.text
    bob_tokens = await keyed.get(f"/ui/api/samples/{ids['bob']}/tokens", headers=alice)
    assert bob_tokens.status_code == 404


async def test_login_keeps_the_key_in_a_ui_cookie(keyed, filled) -> None:
    wrong = await keyed.post("/ui/login", data={"key": "nope", "next": "/ui"})
    assert wrong.status_code == 401 and "not a tenant key" in wrong.text
    ok = await keyed.post("/ui/login", data={"key": "key-bob", "next": "https://evil.example/"})
    assert ok.status_code == 303 and ok.headers["location"] == "/ui"
    cookie = ok.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
    html = (await keyed.get("/ui")).text  # the client keeps the cookie
    assert [r[0] for r in _rows(html)] == ["bobs-secret-task"]
    await keyed.post("/ui/logout")
    assert (await keyed.get("/ui")).status_code == 401
