"""Scale-out on the real SGLang: `rlgw serve --engine-url ROUTER` -> a real `sglang-router` (manual
policy) -> two real SGLang workers on tiny-qwen3, each behind a recording proxy.

The gateway sends `X-SMG-Routing-Key: <session id>` with every engine request, so each session's
turns land on one worker (the proxies see which rids reached which worker; each stored sample lists
its rids), and that worker's radix cache still holds the session's previous turn: a later turn's
`cached_tokens` covers at least the previous turn's whole prompt. Only the worker that served the
previous turn can have it (the sessions' prompts differ from their first user message on).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.procs import free_port, rlgw_process
from tests.support.recording_proxy import Recorder, recording_proxy
from tests.support.router_proc import router
from tests.support.sglang_env import sglang_python, sglang_servers

pytest.importorskip("sglang_router")
pytestmark = pytest.mark.slow

# The manual policy gives a new key a random worker: all 12 sessions on one of two workers (the spread
# check failing) has probability 2**-11. With 4 sessions one CI run in 8 would see it.
SESSIONS = 12
TURNS = 3
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


def test_sessions_stay_on_one_sglang_worker_and_reuse_its_cache(tiny_qwen3: Path, tmp_path: Path) -> None:
    sglang_python()  # skips, naming the build command, before anything starts
    with contextlib.ExitStack() as stack:
        recorders: list[Recorder] = []
        proxies = []
        logs = [tmp_path / f"sglang-{w}.log" for w in range(2)]
        for engine in stack.enter_context(sglang_servers(tiny_qwen3, logs)):
            url, recorder = stack.enter_context(recording_proxy(engine))
            proxies.append(url)
            recorders.append(recorder)
        front = stack.enter_context(router(proxies))
        port = free_port()
        args = ["--log-level", "warning", "serve", "--engine-url", front, "--port", str(port)]
        gw = stack.enter_context(
            rlgw_process([*args, "--data-dir", str(tmp_path / "store")], "/health", port)
        )

        rids_by_session: dict[str, list[str]] = {}
        usage_by_session: dict[str, list[tuple[int, int]]] = {}
        for i in range(SESSIONS):
            s = httpx.post(gw + "/v1/sessions", json={"task_id": f"affinity-{i}"}).raise_for_status().json()
            agent = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
            messages = [{"role": "user", "content": f"Say hello number {i}."}]
            usage = []
            for turn in range(TURNS):
                reply = agent.chat.completions.create(
                    model="any", messages=messages, max_tokens=8, temperature=0, extra_body=NO_THINK
                )
                assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
                usage.append(
                    (reply.usage.prompt_tokens, reply.usage.prompt_tokens_details.cached_tokens or 0)
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
            usage_by_session[s["session_id"]] = usage

    workers_of = {
        sid: {w for w, rec in enumerate(recorders) for rid in rids if rid in rec.by_rid}
        for sid, rids in rids_by_session.items()
    }
    print("workers per session:", workers_of, "(prompt, cached) per turn:", usage_by_session)
    for sid, rids in rids_by_session.items():
        assert all(sum(rid in rec.by_rid for rec in recorders) == 1 for rid in rids), sid
        assert len(workers_of[sid]) == 1, f"session {sid} was served by workers {workers_of[sid]}"
        usage = usage_by_session[sid]
        # Each later turn found at least the previous turn's whole prompt in its worker's radix cache.
        for k in range(1, TURNS):
            assert usage[k - 1][0] <= usage[k][1] < usage[k][0], (sid, usage)
    used = [sum(1 for ws in workers_of.values() if w in ws) for w in range(2)]
    assert min(used) >= 1, f"sessions per worker {used}: the router did not spread sessions"
