"""The training page in headless Chromium: reached from the run list, every chart drawn where its values
say, and a reload shows the iterations appended since. Served by a real uvicorn; skipped without chromium."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from rlgw.gateway.trajectories.store import TrajectoryStore
from rlgw.gateway.viewer import routes as viewer
from tests.gateway.viewer.test_viewer_training import REWARDS, receipt, write
from tests.support import browser
from tests.support.procs import serve_in_thread

pytestmark = pytest.mark.skipif(browser.missing() is not None, reason=str(browser.missing()))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data = tmp_path_factory.mktemp("viewer-training")
    TrajectoryStore.open(data / "store").close_sync()
    store = TrajectoryStore.open_readonly(data / "store")
    path = write(
        data / "receipts.jsonl", [receipt(i, reward=r, staleness=i % 2) for i, r in enumerate(REWARDS)]
    )
    with serve_in_thread(viewer.viewer_app(store, receipts=path)) as url, browser.browser() as b:
        yield {"url": url, "browser": b, "receipts": path}
    store.close_sync()


def _points(page: Any, chart: str) -> list[tuple[int, float, float]]:
    """(iteration, value, screen y of the centre) of each point drawn in `chart`."""
    return page.eval_on_selector_all(
        f'figure[data-chart="{chart}"] circle.pt',
        "els => els.map(e => { const b = e.getBoundingClientRect();"
        " return [Number(e.dataset.iteration), Number(e.dataset.value), b.top + b.height / 2]; })",
    )


def test_the_training_page_draws_each_receipt_where_its_values_say(site) -> None:
    ctx = site["browser"].new_context()
    page = ctx.new_page()
    page.goto(site["url"] + "/ui")
    page.click("header .nav")  # the run list links to the training page
    page.wait_for_selector("figure.chart")
    charts = page.eval_on_selector_all("figure.chart", "els => els.map(e => e.dataset.chart)")
    assert charts == ["reward", "kl", "clipfrac", "is_ratio", "staleness", "time"]
    reward = _points(page, "reward")
    assert [(i, v) for i, v, _ in reward] == list(enumerate(REWARDS))
    by_height = sorted(reward, key=lambda p: p[2])  # top of the screen first
    assert [v for _, v, _ in by_height] == sorted(REWARDS, reverse=True)
    assert page.locator('figure[data-chart="reward"] polyline').is_visible()
    assert [v for _, v, _ in _points(page, "staleness")] == [0, 1, 0, 1]
    assert "not in these receipts" in page.locator('figure[data-chart="kl"]').inner_text()
    # the time split: per iteration, train stacked on rollout and sync on train, heights as the seconds
    bars = page.eval_on_selector_all(
        'figure[data-chart="time"] rect.bar',
        "els => els.map(e => { const b = e.getBoundingClientRect();"
        " return [e.dataset.series, Number(e.dataset.iteration), b.top, b.height]; })",
    )
    for it in range(len(REWARDS)):
        rollout, train, sync = (
            next(b for b in bars if b[0] == k and b[1] == it) for k in ("rollout", "train", "sync")
        )
        assert train[2] + train[3] == pytest.approx(rollout[2], abs=0.6)
        assert sync[2] + sync[3] == pytest.approx(train[2], abs=0.6)
        assert rollout[3] / train[3] == pytest.approx(2.0 + it, rel=0.05)
    assert page.locator("table.receipts tbody tr").count() == len(REWARDS)
    # the run goes on: a reload shows the receipt appended since
    write(site["receipts"], [receipt(i, reward=r) for i, r in enumerate([*REWARDS, 1.0])])
    page.reload()
    assert [v for _, v, _ in _points(page, "reward")] == [*REWARDS, 1.0]
    ctx.close()
