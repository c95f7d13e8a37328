"""The viewer in headless Chromium: the list, token colours against the sample, a 32k-token sample,
and tenant scoping through the login form. Served by a real uvicorn; skipped without chromium."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from transformers import AutoTokenizer

from rlgw.gateway.trajectories.store import TrajectoryStore
from tests.gateway.viewer.test_viewer import _keyed_app
from tests.support import browser
from tests.support.procs import serve_in_thread
from tests.support.viewer_samples import tool_conversation

pytestmark = pytest.mark.skipif(browser.missing() is not None, reason=str(browser.missing()))

# Generous: the issue asks for under 2 s; bench/viewer.py measures it. This bound only catches a viewer
# that renders all 32k tokens up front or waits on something.
OPEN_BOUND_S = 10.0
LONG_TOKENS = 32_768


@pytest.fixture(scope="module")
def site(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    rng = np.random.default_rng(7)
    short = tool_conversation(tok, rng, repeats=2)
    long = tool_conversation(tok, rng, repeats=650)
    long.metadata["termination_reason"] = "long_run"
    assert len(long.tokens) >= LONG_TOKENS
    bobs = tool_conversation(tok, rng)
    # A main agent (conversation 0), its subagent (1) and the subagent's own subagent (2).
    lineage = [
        tool_conversation(
            tok,
            rng,
            metadata={
                "segment": i,
                "segments": 3,
                "segment_cause": "start" if i == 0 else "new_conversation",
                "conversation": i,
                "conversation_parent": None if i == 0 else i - 1,
                "conversations": 3,
            },
        )
        for i in range(3)
    ]
    data = tmp_path_factory.mktemp("viewer-browser")

    async def fill() -> list[int]:
        store = TrajectoryStore.open(data)
        cursors = await store.add_samples("alice", "sess-a", "weather-paris", [short])
        cursors += await store.add_samples("alice", "sess-long", "long-task", [long])
        cursors += await store.add_samples("bob", "sess-b", "bobs-secret-task", [bobs])
        cursors += await store.add_samples("alice", "sess-tree", "subagents", lineage, segments=[0, 1, 2])
        await store.close()
        return cursors

    cursors = asyncio.run(fill())
    store = TrajectoryStore.open_readonly(data)
    with serve_in_thread(_keyed_app(store, tok)) as url, browser.browser() as b:
        yield {
            "url": url,
            "browser": b,
            "short": (cursors[0], short),
            "long": (cursors[1], long),
            "bob": cursors[2],
            "tree": cursors[3],
        }
    store.close_sync()


def _alice(site: dict[str, Any]) -> Any:
    return site["browser"].new_context(extra_http_headers={"Authorization": "Bearer key-alice"})


def _rgb(css: str) -> tuple[int, ...]:
    return tuple(int(float(x)) for x in css[css.index("(") + 1 : css.index(")")].split(",")[:3])


def test_list_shows_the_run_and_its_tokens_are_coloured_by_mask(site) -> None:
    cursor, sample = site["short"]
    ctx = _alice(site)
    page = ctx.new_page()
    page.goto(site["url"] + "/ui")
    row = page.locator(f'tr[data-cursor="{cursor}"]')
    assert row.locator("td").first.inner_text() == "weather-paris"
    row.locator("a").click()
    page.wait_for_selector(f'.tokens[data-loaded="{len(sample.tokens)}"]')
    spans = page.eval_on_selector_all(
        '.tokens[data-seg="0"] .tok',
        "els => els.map(e => [Number(e.dataset.i), e.className, getComputedStyle(e).backgroundColor])",
    )
    assert [i for i, _, _ in spans] == list(range(len(sample.tokens)))
    mask = np.concatenate([np.zeros(sample.prompt_length, np.uint8), sample.loss_mask])
    assert [("k1" in cls) for _, cls, _ in spans] == [bool(m) for m in mask]
    on = {bg for i, _, bg in spans if mask[i]}
    off = {bg for i, _, bg in spans if not mask[i]}
    assert on and off and not on & off
    # The heat scale follows the sampled token's probability: green when sure, red when not.
    lp = np.full(len(mask), np.nan)
    lp[sample.prompt_length :][sample.loss_mask == 1] = sample.rollout_log_probs[sample.loss_mask == 1]
    for i, _, bg in spans:
        if mask[i]:
            r, g, _ = _rgb(bg)
            if np.exp(lp[i]) > 0.8:
                assert g > r, (i, bg)
            elif np.exp(lp[i]) < 0.2:
                assert r > g, (i, bg)
    # Tool output has its own colour, neither sampled nor template.
    tool = {bg for _, cls, bg in spans if "k2" in cls}
    assert len(tool) == 1 and not tool & on
    ctx.close()


def test_a_runs_conversations_are_shown_as_a_tree(site) -> None:
    ctx = _alice(site)
    page = ctx.new_page()
    page.goto(site["url"] + f"/ui/runs/{site['tree']}")
    # Each conversation's node sits inside its parent's: 0 > 1 > 2, and names its segment.
    nested = page.eval_on_selector_all(
        "li.conversation",
        """els => els.map(e => [Number(e.dataset.conversation),
            e.parentElement.closest('li.conversation')?.dataset.conversation ?? null,
            [...e.querySelectorAll(':scope > a.seglink')].map(a => a.getAttribute('href'))])""",
    )
    assert nested == [[0, None, ["#seg-0"]], [1, "0", ["#seg-1"]], [2, "1", ["#seg-2"]]]
    page.locator('li.conversation[data-conversation="2"] > a.seglink').click()
    assert page.url.endswith("#seg-2")
    assert "conversation 2" in page.locator("#seg-2 h2").inner_text()
    ctx.close()


def test_a_32k_token_sample_opens_fast_and_loads_lazily(site) -> None:
    cursor, sample = site["long"]
    ctx = _alice(site)
    page = ctx.new_page()
    start = time.perf_counter()
    page.goto(f"{site['url']}/ui/runs/{cursor}")
    page.wait_for_selector('.tokens[data-loaded]:not([data-loaded="0"])')
    opened = time.perf_counter() - start
    print(f"\n32k-token sample ({len(sample.tokens)} tokens): first tokens shown after {opened:.2f} s")
    assert opened < OPEN_BOUND_S
    loaded = int(page.get_attribute(".tokens", "data-loaded"))
    assert loaded < len(sample.tokens)  # only the first page is in the DOM
    page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    page.wait_for_function(f"Number(document.querySelector('.tokens').dataset.loaded) > {loaded}")
    ctx.close()


def test_a_tenant_cannot_see_another_tenants_run(site) -> None:
    ctx = site["browser"].new_context()
    page = ctx.new_page()
    page.goto(site["url"] + "/ui")
    page.fill('input[name="key"]', "key-alice")
    page.click("form.login button")
    page.wait_for_selector("table.runs")
    tasks = page.locator("table.runs tbody tr td:first-child").all_inner_texts()
    assert sorted(tasks) == ["long-task", "subagents", "weather-paris"]
    assert "bobs-secret-task" not in page.content()
    resp = page.goto(f"{site['url']}/ui/runs/{site['bob']}")
    assert resp is not None and resp.status == 404
    assert "bobs-secret-task" not in page.content()
    ctx.close()
