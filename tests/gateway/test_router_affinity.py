"""Scale-out on existing engines: `rlgw serve` -> a real `sglang-router` -> two `rlgw engine` workers.

The gateway sends `X-SMG-Routing-Key: <session id>` with every engine request; the router's
`manual` policy keeps each key on one worker. A recording proxy in front of each worker sees
which engine request ids (rids) reached it; each session's stored sample lists its rids. So:
every turn of a session landed on one worker (its prefix cache stays warm), and the sessions
spread over both workers.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.procs import engine_server, free_port, rlgw_process
from tests.support.recording_proxy import Recorder, recording_proxy
from tests.support.router_proc import router

pytest.importorskip("sglang_router")

# The manual policy gives a new key a random worker: all 16 sessions on one of two workers (the
# spread check failing) has probability 2**-15. With 8, one CI run in 128 saw it.
SESSIONS = 16
TURNS = 3


@pytest.mark.slow
def test_each_session_stays_on_one_worker_and_sessions_spread(tiny_qwen3: Path, tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        recorders: list[Recorder] = []
        proxies = []
        for _ in range(2):
            engine = stack.enter_context(engine_server(tiny_qwen3))
            url, recorder = stack.enter_context(recording_proxy(engine))
            proxies.append(url)
            recorders.append(recorder)
        front = stack.enter_context(router(proxies))
        port = free_port()
        args = ["serve", "--engine-url", front, "--port", str(port), "--data-dir", str(tmp_path)]
        gw = stack.enter_context(rlgw_process(args, "/health", port))

        rids_by_session: dict[str, list[str]] = {}
        for i in range(SESSIONS):
            s = httpx.post(gw + "/v1/sessions", json={"task_id": f"affinity-{i}"}).raise_for_status().json()
            agent = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"])
            messages = [{"role": "user", "content": f"Say hello number {i}."}]
            for turn in range(TURNS):
                reply = agent.chat.completions.create(
                    model="any", messages=messages, max_tokens=8, temperature=0, seed=i
                )
                messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
                messages.append({"role": "user", "content": f"And again ({turn})."})
            summary = httpx.post(gw + f"/v1/sessions/{s['session_id']}/finish", json={"reward": 1.0})
            rids: list[str] = []
            for sample in summary.raise_for_status().json()["samples"]:
                doc = httpx.get(gw + f"/v1/trajectories/{sample['cursor']}").raise_for_status().json()
                rids += doc["metadata"]["engine_rids"]
            assert len(rids) == TURNS
            rids_by_session[s["session_id"]] = rids

    workers_of = {
        sid: {w for w, rec in enumerate(recorders) for rid in rids if rid in rec.by_rid}
        for sid, rids in rids_by_session.items()
    }
    # Every rid reached exactly one worker, and all of a session's rids the same one.
    for sid, rids in rids_by_session.items():
        assert all(sum(rid in rec.by_rid for rec in recorders) == 1 for rid in rids), sid
        assert len(workers_of[sid]) == 1, f"session {sid} was served by workers {workers_of[sid]}"
    used = [sum(1 for ws in workers_of.values() if w in ws) for w in range(2)]
    assert min(used) >= 1, f"sessions per worker {used}: the router did not spread sessions"
