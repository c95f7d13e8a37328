"""`GatewayClient`: the trajectory iterator against a real server; session calls' errors via respx."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import httpx
import numpy as np
import pytest
import respx

from rlgw.gateway.trajectories.backends import open_store
from rlgw.gateway.trajectories.client import (
    FinishSummary,
    GatewayClient,
    GatewayConnectionError,
    GatewayRequestError,
    GatewayServerError,
    RejectedSegment,
)
from rlgw.gateway.trajectories.store import TrajectoryStore
from tests.support.sample_factory import assert_same_sample, make_sample
from tests.support.store_backends import BACKENDS, store_location
from tests.support.trajectory_app import serve, trajectory_app

BASE = "http://gw.test"


@pytest.fixture(params=BACKENDS)
async def served(request: pytest.FixtureRequest, tmp_path: Path):
    store = open_store(store_location(request, request.param, tmp_path), tmp_path)
    async with serve(trajectory_app(store, {"key-a": "a", "key-b": "b"})) as url:
        yield store, url
    await store.close()


async def test_trajectories_follow_the_stream_across_long_polls(served) -> None:
    store, url = served
    rng = np.random.default_rng(0)
    early = [make_sample(rng) for _ in range(3)]
    late = [make_sample(rng, teacher_k=3) for _ in range(4)]
    await store.add_samples("b", "other", "t", [make_sample(rng)])  # another tenant's: never yielded
    cursors = await store.add_samples("a", "s1", "task", early)

    got = []
    history_read = asyncio.Event()

    async def follow() -> None:
        async with GatewayClient(url, "key-a") as gw:
            async for item in gw.trajectories(batch=2, wait=20):  # batch < count: several requests
                got.append(item)
                if len(got) == len(early):
                    history_read.set()
                if len(got) == len(early) + len(late):
                    return

    follower = asyncio.create_task(follow())
    await asyncio.wait_for(history_read.wait(), 10)  # history first (two requests of batch=2) ...
    await asyncio.sleep(0.2)  # ... then it sits in a long poll
    assert [g.cursor for g in got] == cursors
    cursors += await store.add_samples("a", "s2", "task", late[:1])
    await asyncio.sleep(0.1)
    cursors += await store.add_samples("a", "s3", "task", late[1:])
    await asyncio.wait_for(follower, 10)

    assert [g.cursor for g in got] == cursors
    assert [(g.session_id, g.segment) for g in got[3:]] == [("s2", 0), ("s3", 0), ("s3", 1), ("s3", 2)]
    for item, want in zip(got, early + late, strict=True):
        assert_same_sample(item.sample, want)


async def test_resume_after_a_cursor_and_fetch_one(served) -> None:
    store, url = served
    rng = np.random.default_rng(1)
    samples = [make_sample(rng) for _ in range(4)]
    cursors = await store.add_samples("a", "s", "task", samples)
    async with GatewayClient(url, "key-a") as gw:
        stream = gw.trajectories(after=cursors[1], wait=1)
        assert [(await anext(stream)).cursor for _ in range(2)] == cursors[2:]
        await stream.aclose()
        one = await gw.get_trajectory(cursors[0])
        assert_same_sample(one.sample, samples[0])
    async with GatewayClient(url, "key-b") as gw:
        with pytest.raises(GatewayRequestError) as info:
            await gw.get_trajectory(cursors[0])
        assert info.value.status == 404 and info.value.code == "trajectory_not_found"


async def test_stream_errors_carry_the_openai_message(served) -> None:
    _, url = served
    async with GatewayClient(url, "not-a-key") as gw:
        with pytest.raises(GatewayRequestError) as info:
            await anext(gw.trajectories())
    assert info.value.status == 401
    assert info.value.code == "invalid_api_key"
    assert "Invalid or missing tenant API key" in str(info.value)
    async with GatewayClient(url, "key-a") as gw:
        with pytest.raises(GatewayRequestError, match="'limit' must be between 1 and 1000"):
            await anext(gw.trajectories(batch=0))


@respx.mock
async def test_session_calls_parse_the_contract_and_map_errors() -> None:
    created = respx.post(f"{BASE}/v1/sessions").mock(
        return_value=httpx.Response(
            200,
            json={
                "session_id": "s-1",
                "base_url": f"{BASE}/s/s-1/v1",
                "api_key": "sk-sess",
                "mode": "capture",
                "rollout_id": "r-7",
            },
        )
    )
    respx.post(f"{BASE}/v1/sessions/s-1/finish").mock(
        return_value=httpx.Response(
            200,
            json={
                "session_id": "s-1",
                "samples": [{"cursor": 12, "segment": 0, "trainable_tokens": 40, "response_length": 55}],
                "trainable_tokens": 40,
                "segments": 2,
                "rejects": [{"segment": 1, "reason": "empty", "detail": "no trainable token"}],
            },
        )
    )
    respx.get(f"{BASE}/v1/sessions/missing").mock(
        return_value=httpx.Response(
            404,
            json={
                "error": {
                    "message": "No session 'missing'.",
                    "type": "not_found_error",
                    "param": None,
                    "code": "session_not_found",
                }
            },
        )
    )
    respx.delete(f"{BASE}/v1/sessions/s-1").mock(return_value=httpx.Response(502, text="bad gateway"))

    async with GatewayClient(BASE, "tenant-key") as gw:
        info = await gw.create_session("task-3", rollout_id="r-7", metadata={"k": 1})
        assert (info.session_id, info.api_key, info.rollout_id) == ("s-1", "sk-sess", "r-7")
        sent = created.calls.last.request
        assert sent.headers["authorization"] == "Bearer tenant-key"
        assert httpx.Response(200, content=sent.content).json() == {
            "task_id": "task-3",
            "mode": "capture",
            "group_index": 0,
            "rollout_id": "r-7",
            "metadata": {"k": 1},
        }

        summary = await gw.finish_session("s-1", reward=1.0)
        assert isinstance(summary, FinishSummary)
        assert summary.samples[0].cursor == 12 and summary.segments == 2
        assert summary.rejects == [RejectedSegment(1, "empty", "no trainable token")]

        with pytest.raises(GatewayRequestError) as err:
            await gw.get_session("missing")
        assert err.value.status == 404 and err.value.code == "session_not_found"
        assert err.value.message == "No session 'missing'."

        with pytest.raises(GatewayServerError, match=r"502.*bad gateway"):
            await gw.delete_session("s-1")


async def test_unreachable_gateway_is_a_connection_error() -> None:
    from tests.support.procs import free_port

    async with GatewayClient(f"http://127.0.0.1:{free_port()}", timeout=2) as gw:
        with pytest.raises(GatewayConnectionError):
            await gw.get_session("x")
        with pytest.raises(GatewayConnectionError):
            await anext(gw.trajectories())


async def test_polls_that_find_nothing_are_spaced_even_with_no_wait(tmp_path: Path) -> None:
    store = TrajectoryStore.open(tmp_path)
    app = trajectory_app(store, {"key-a": "a"})
    polls = []

    async def counting(scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/trajectories":
            polls.append(asyncio.get_running_loop().time())
        await app(scope, receive, send)

    async with serve(counting) as url, GatewayClient(url, "key-a") as gw:
        stream = gw.trajectories(wait=0)
        follower = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(1.5)
        assert 1 <= len(polls) <= 2  # wait=0 answers at once: without a floor, hundreds of polls
        [cursor] = await store.add_samples("a", "s", "task", [make_sample(np.random.default_rng(2))])
        item = await asyncio.wait_for(follower, 5)  # the next poll still finds it
        assert item.cursor == cursor
        assert all(b - a >= 0.9 for a, b in itertools.pairwise(polls))
        await stream.aclose()
    await store.close()
