"""`GET /v1/trajectories` over real HTTP: NDJSON paging, tenant isolation, long poll, bad parameters."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest

from rlgw.gateway.sample import Sample
from rlgw.gateway.trajectories.api import PAGE_ROWS
from rlgw.gateway.trajectories.backends import open_store
from tests.support.sample_factory import assert_same_sample, make_sample
from tests.support.store_backends import BACKENDS, store_location
from tests.support.trajectory_app import serve, trajectory_app

KEYS = {"key-alice": "alice", "key-bob": "bob"}


@pytest.fixture(params=BACKENDS)
async def env(request: pytest.FixtureRequest, tmp_path: Path):
    store = open_store(store_location(request, request.param, tmp_path), tmp_path)
    async with serve(trajectory_app(store, KEYS)) as url:
        async with (
            httpx.AsyncClient(
                base_url=url, headers={"Authorization": "Bearer key-alice"}, timeout=30
            ) as alice,
            httpx.AsyncClient(base_url=url, headers={"Authorization": "Bearer key-bob"}, timeout=30) as bob,
        ):
            yield store, alice, bob
    await store.close()


def lines(resp: httpx.Response) -> list[dict]:
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/x-ndjson"
    return [orjson.loads(line) for line in resp.content.splitlines()]


async def test_stream_pages_by_cursor_with_exact_samples(env) -> None:
    store, alice, _ = env
    rng = np.random.default_rng(0)
    samples = [make_sample(rng, teacher_k=2 if i == 3 else 0) for i in range(PAGE_ROWS + 9)]
    cursors = await store.add_samples("alice", "s1", "task-a", samples)

    docs = lines(await alice.get("/v1/trajectories", params={"limit": 1000}))
    assert [d["cursor"] for d in docs] == cursors  # several internal pages, one ordered stream
    assert [d["segment"] for d in docs] == list(range(len(samples)))
    for doc, want in zip(docs, samples, strict=True):
        assert doc["session_id"] == "s1" and doc["task_id"] == "task-a"
        meta = {k: doc.pop(k) for k in ("cursor", "session_id", "task_id", "segment", "created_at")}
        assert meta["created_at"] > 0
        assert_same_sample(Sample.from_dict(doc), want)

    page = lines(await alice.get("/v1/trajectories", params={"after": cursors[4], "limit": 3}))
    assert [d["cursor"] for d in page] == cursors[5:8]
    assert lines(await alice.get("/v1/trajectories", params={"after": cursors[-1]})) == []

    one = await alice.get(f"/v1/trajectories/{cursors[3]}")
    assert one.status_code == 200
    assert one.json()["teacher_topk_indices"] == samples[3].teacher_topk_indices.tolist()


async def test_tenants_never_see_each_other(env) -> None:
    store, alice, bob = env
    rng = np.random.default_rng(1)
    ca = await store.add_samples("alice", "sa", "t", [make_sample(rng), make_sample(rng)])
    cb = await store.add_samples("bob", "sb", "t", [make_sample(rng)])

    assert [d["cursor"] for d in lines(await alice.get("/v1/trajectories"))] == ca
    assert [d["cursor"] for d in lines(await bob.get("/v1/trajectories"))] == cb
    # Bob asking for Alice's cursor gets the same 404 as for a cursor that never existed.
    for cursor in (ca[0], 9999):
        resp = await bob.get(f"/v1/trajectories/{cursor}")
        assert resp.status_code == 404
        assert resp.json()["error"]["code"] == "trajectory_not_found"
    anon = await alice.get("/v1/trajectories", headers={"Authorization": "Bearer wrong"})
    assert anon.status_code == 401
    assert anon.json()["error"]["code"] == "invalid_api_key"


async def test_long_poll_answers_when_a_sample_arrives(env) -> None:
    store, alice, bob = env
    rng = np.random.default_rng(2)
    bob_poll = asyncio.create_task(bob.get("/v1/trajectories", params={"wait": 0.5}))
    poll = asyncio.create_task(alice.get("/v1/trajectories", params={"after": 0, "wait": 30}))
    await asyncio.sleep(0.3)
    assert not poll.done()
    cursors = await store.add_samples("alice", "s", "t", [make_sample(rng)])
    resp = await asyncio.wait_for(poll, 5)  # the commit wakes it, long before 30 s
    assert [d["cursor"] for d in lines(resp)] == cursors
    # Bob's poll is not woken by Alice's sample; it runs out and answers empty.
    assert lines(await bob_poll) == []


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"after": "abc"}, "after"),
        ({"after": -1}, "after"),
        ({"wait": "soon"}, "wait"),
        ({"wait": -2}, "wait"),
        ({"wait": "nan"}, "wait"),
    ],
)
async def test_bad_parameters_are_openai_400s(env, query: dict, param: str) -> None:
    _, alice, _ = env
    resp = await alice.get("/v1/trajectories", params=query)
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and param in err["message"]


async def test_bad_cursor_in_path_is_400(env) -> None:
    _, alice, _ = env
    resp = await alice.get("/v1/trajectories/12x")
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "cursor"
