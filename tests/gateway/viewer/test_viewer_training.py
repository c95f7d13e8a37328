"""The viewer's training page over a receipts file: reading it as `rlgw train` appends, the charts' values,
the JSON series, and what the page says with no file or a bad one (real uvicorn-free ASGI client)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rlgw.gateway.trajectories.store import TrajectoryStore
from rlgw.gateway.viewer import routes as viewer
from rlgw.gateway.viewer import training


def receipt(it: int, *, reward: float, kl: float | None = None, staleness: int = 0) -> dict[str, Any]:
    """A receipt with the fields `trainer/loop.py` writes that the page reads."""
    return {
        "iteration": it, "reward_mean": reward, "reward_std": 0.3, "rollouts": 64, "samples": 64,
        "trainable_tokens": 1200 + it, "failed_runs": 0, "max_staleness": staleness,
        "stale_tokens_masked": 7 * staleness, "logprob_gap_max": 3e-6, "is_ratio_mean": 1.0 + it * 1e-4,
        "kl": kl, "losses": {"pg_loss": 0.0, "clipfrac": 0.01 * it, "ratio_mean": 1.0, "grad_norm": 0.1},
        "published": {"version": it + 1, "kind": "delta", "served_versions": [str(it + 1)]},
        "seconds": {"rollout": 2.0 + it, "train": 1.0, "sync": 0.5, "total": 3.5 + it},
    }  # fmt: skip


REWARDS = [0.1, 0.4, 0.3, 0.9]


def write(path: Path, receipts: list[dict[str, Any]], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in receipts) + tail)
    return path


def test_a_line_still_being_written_is_left_out_and_a_bad_line_is_named(tmp_path: Path) -> None:
    rs = [receipt(i, reward=r) for i, r in enumerate(REWARDS)]
    partial = json.dumps(receipt(4, reward=1.0))[:40]
    assert training.load_receipts(write(tmp_path / "r.jsonl", rs, tail=partial)) == rs
    with pytest.raises(training.ReceiptsError, match="line 2 is not JSON"):
        training.load_receipts(write(tmp_path / "bad.jsonl", rs[:1], tail="{oops\n"))
    with pytest.raises(training.ReceiptsError, match="line 1 is not a receipt"):
        training.load_receipts(write(tmp_path / "list.jsonl", [], tail="[1, 2]\n"))
    with pytest.raises(training.ReceiptsError, match="cannot read"):
        training.load_receipts(tmp_path / "absent.jsonl")


def test_charts_place_higher_values_higher_and_stack_the_time_split() -> None:
    rs = [receipt(i, reward=r, staleness=i % 2) for i, r in enumerate(REWARDS)]
    charts = {c.key: c for c in training.charts(rs)}
    assert list(charts) == ["reward", "kl", "clipfrac", "is_ratio", "staleness", "time"]
    (mean,) = charts["reward"].series
    assert [p.value for p in mean.points] == REWARDS
    ys = [p.y for p in mean.points]
    assert sorted(range(4), key=lambda i: ys[i]) == sorted(range(4), key=lambda i: -REWARDS[i])
    xs = [p.x for p in mean.points]
    assert xs == sorted(xs) and training.LEFT <= xs[0] and xs[-1] <= training.WIDTH - training.RIGHT
    assert charts["kl"].empty  # kl_coef 0: no KL in the receipts, and the page says so
    assert [p.value for p in charts["staleness"].series[0].points] == [0, 1, 0, 1]
    # time: three layers per iteration, each bar's height proportional to its seconds
    layers = {s.key: s.bars for s in charts["time"].series}
    assert list(layers) == ["rollout", "train", "sync"]
    for i in range(4):
        rollout, train, sync = (layers[k][i] for k in ("rollout", "train", "sync"))
        assert rollout.height / train.height == pytest.approx(rs[i]["seconds"]["rollout"] / 1.0)
        assert train.y + train.height == pytest.approx(rollout.y)  # train sits on rollout
        assert sync.y + sync.height == pytest.approx(train.y)


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Path]]:
    store = TrajectoryStore.open(tmp_path / "store")
    await store.close()
    store = TrajectoryStore.open_readonly(tmp_path / "store")
    path = tmp_path / "receipts.jsonl"
    app = viewer.viewer_app(store, receipts=path)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        yield c, path
    await store.close()


async def test_the_page_and_its_json_follow_the_file_as_the_run_appends(client) -> None:
    c, path = client
    write(path, [])
    page = await c.get("/ui/training")
    assert page.status_code == 200 and "No receipts yet" in page.text
    write(path, [receipt(i, reward=r) for i, r in enumerate(REWARDS[:2])])
    assert (await c.get("/ui/api/training")).json()["charts"]["reward"] == {"mean": REWARDS[:2]}
    write(path, [receipt(i, reward=r, kl=0.01 * i) for i, r in enumerate(REWARDS)])
    got = (await c.get("/ui/api/training")).json()
    assert got["iterations"] == [0, 1, 2, 3]
    assert got["charts"]["reward"] == {"mean": REWARDS}
    assert got["charts"]["kl"] == {"kl": [0.0, 0.01, 0.02, 0.03]}
    assert got["charts"]["time"]["rollout"] == [2.0, 3.0, 4.0, 5.0]
    page = await c.get("/ui/training")
    assert page.status_code == 200 and page.text.count('<tr data-iteration="') == 4
    assert page.text.count('class="pt" data-series="mean"') == 4


async def test_a_bad_file_is_a_server_error_that_names_the_line(client) -> None:
    c, path = client
    write(path, [receipt(0, reward=0.1)], tail="not json\n")
    page = await c.get("/ui/training")
    assert page.status_code == 500 and "line 2 is not JSON" in page.text
    api = await c.get("/ui/api/training")
    assert api.status_code == 500 and api.json()["error"]["code"] == "invalid_receipts"


async def test_a_viewer_without_receipts_says_how_to_get_them(tmp_path: Path) -> None:
    store = TrajectoryStore.open(tmp_path / "store")
    app = viewer.viewer_app(store)  # as `rlgw trajectories view` without --receipts
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        page = await c.get("/ui/training")
        assert page.status_code == 404 and "--receipts WORK_DIR/receipts.jsonl" in page.text
        assert (await c.get("/ui/api/training")).status_code == 404
    await store.close()
