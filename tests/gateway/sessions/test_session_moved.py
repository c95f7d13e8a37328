"""A gateway's stale copy of a session never commits: on a shared (PostgreSQL) journal, when another
gateway of the fleet served turns of a session meanwhile (its gateway was marked down and came
back, say), the first gateway's next turn on its old copy is refused with a retryable 503
`session_moved` and nothing committed; the retry is served from the journal's turns, so the sample
holds every sampled turn as sampled (mask 1), and no model text re-tokenized as agent text.

Without the check, the stale copy took the turns it lacked from the request's history: the
second turn's reply went into the sample as mask-0 text, and the sample held 2 of 3 sampled turns.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np

from rlgw.gateway.sample import Sample
from rlgw.gateway.trajectories.client import GatewayClient
from tests.support.fault_engine import FaultEngine
from tests.support.gateway_proc import Gateway, gateways


def _chat(gw: Gateway, s: dict, messages: list[dict]) -> httpx.Response:
    return httpx.post(
        gw.url + f"/s/{s['session_id']}/v1/chat/completions",
        headers={"Authorization": f"Bearer {s['api_key']}"},
        json={"model": "m", "messages": messages, "max_tokens": 8, "temperature": 0.0},
        timeout=60,
    )


def _turn(gw: Gateway, s: dict, messages: list[dict], user: str) -> None:
    """One turn: the user's line, the reply appended to `messages` (the agent's history)."""
    messages.append({"role": "user", "content": user})
    r = _chat(gw, s, messages)
    assert r.status_code == 200, r.text
    messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})


def _mask_runs(mask: np.ndarray) -> int:
    m = np.asarray(mask, dtype=np.int8)
    return int(np.count_nonzero(np.diff(np.concatenate([[0], m])) == 1))


async def _sample(url: str, cursor: int) -> Sample:
    async with GatewayClient(url) as client:
        return (await client.get_trajectory(cursor)).sample


def test_a_stale_copy_is_refused_and_the_retry_continues_from_the_journal(
    fe: FaultEngine, pg_url: str, tmp_path: Path
) -> None:
    args = ["--store", pg_url, "--journal", pg_url]
    specs = [(tmp_path / f"host{i}", args, None) for i in range(2)]
    for tmp, _, _ in specs:
        tmp.mkdir()
    with gateways(fe.url, specs) as (a, b):
        s = httpx.post(a.url + "/v1/sessions", json={"task_id": "moved"}).json()
        messages: list[dict] = []
        _turn(a, s, messages, "one")  # a holds a copy with 1 turn
        _turn(b, s, messages, "two")  # b restores it from the journal and commits turn 2
        messages.append({"role": "user", "content": "three"})
        refused = _chat(a, s, messages)  # a's copy lacks turn 2
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "session_moved"
        retried = _chat(a, s, messages)  # served from the journal's 2 turns
        assert retried.status_code == 200, retried.text
        messages.append({"role": "assistant", "content": retried.json()["choices"][0]["message"]["content"]})

        summary = httpx.post(a.url + f"/v1/sessions/{s['session_id']}/finish", json={"reward": 1.0}).json()
        assert [c["cause"] for c in summary["segment_causes"]] == ["start"], summary
        sample = asyncio.run(_sample(a.url, summary["samples"][0]["cursor"]))
        assert sample.metadata["session_turns"] == 3
        assert _mask_runs(sample.loss_mask) == 3  # each sampled reply once, as sampled
