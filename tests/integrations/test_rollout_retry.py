"""A trainer's retried rollout (same rollout id, its first answer lost) is served from the stored finish:
`AgentRunner` gets the stored outcome back, the agent does not run again, and nothing is stored twice."""

from __future__ import annotations

import asyncio

import pytest

from rlgw.gateway.trajectories.client import GatewayClient, GatewayRequestError, SessionInfo
from rlgw.integrations.rollout import AgentRunner, ChatLoop, Rollout, TaskRequest, run_rollout
from tests.integrations.agents import LOOP
from tests.integrations.conftest import stream
from tests.support import fixture_prompts as fp
from tests.support.e2e import Stack


async def test_a_retried_rollout_returns_the_stored_one_without_running_again(qwen3: Stack) -> None:
    runs: list[str] = []

    async def agent(session: SessionInfo, request: TaskRequest) -> float:
        runs.append(session.session_id)
        await LOOP(session, request)
        return 0.5

    request = TaskRequest(task_id="retried", rollout_id="retried-rollout-1", prompt=fp.WEATHER)
    async with GatewayClient(qwen3.gateway) as gw:
        first = await run_rollout(gw, AgentRunner(agent), request)
        again = await run_rollout(gw, AgentRunner(agent), request)
    assert first.ok and len(runs) == 1  # the agent ran once
    assert again.session_id == first.session_id and again.reward == 0.5
    assert [t.cursor for t in again.samples] == [t.cursor for t in first.samples]
    assert again.termination == "finish" and again.error is None
    stored = [d for d in stream(qwen3) if d["rollout_id"] == "retried-rollout-1"]
    assert len(stored) == len(first.samples)  # stored once


async def two_live_attempts(
    st: Stack, rollout_id: str, *, first_fails: bool = False
) -> tuple[Rollout, Rollout, list[str]]:
    """Two attempts of one rollout run at once: both open a session and take turns before either
    finishes, and the second finishes after the first. With `first_fails`, the first attempt's agent
    raises after its turns. Returns both outcomes and the sessions in the order they opened.

    An attempt that ends without reaching the rendezvous (its agent failed, or it got a stored outcome
    and never ran) breaks it, so the other attempt fails instead of waiting for it forever.
    """
    # One plain turn each, no tools: the two attempts decode in one batch, and the tiny fixture's greedy
    # output may then differ from its usual one (a tool call cut inside its arguments fails a tool loop);
    # what is under test is the stored finish, not the reply.
    one_turn = ChatLoop(max_turns=1, chat_template_kwargs={"enable_thinking": False})
    both_open = asyncio.Barrier(2)
    first_finished = asyncio.Event()
    runs: list[str] = []

    async def agent(session: SessionInfo, request: TaskRequest) -> float:
        runs.append(session.session_id)
        await one_turn(session, request)
        if first_fails and session.session_id == runs[0]:
            raise RuntimeError("the first attempt's sandbox went away")
        await both_open.wait()  # both sessions exist and have turns before either finishes
        if len(runs) == 2 and session.session_id == runs[1]:
            await first_finished.wait()
        return 1.0 if session.session_id == runs[0] else 0.0

    request = TaskRequest(task_id="twice", rollout_id=rollout_id, prompt=fp.WEATHER)
    async with GatewayClient(st.gateway) as gw:

        async def attempt() -> Rollout:
            try:
                return await run_rollout(gw, AgentRunner(agent), request)
            finally:
                first_finished.set()
                await both_open.abort()

        a, b = await asyncio.gather(attempt(), attempt())
        if len(runs) == 2:
            with pytest.raises(GatewayRequestError) as gone:
                await gw.get_session(runs[1])  # the refused attempt's session was deleted
            assert gone.value.status == 404
    return a, b, runs


async def test_two_live_attempts_of_a_rollout_store_it_once(qwen3: Stack) -> None:
    """A retry launched while the first attempt still runs (its worker thought dead): both run and
    finish; the first finish stores the rollout, the second is refused (409 `rollout_stored`), its
    session is dropped, and both report the stored run."""
    a, b, runs = await two_live_attempts(qwen3, "live-twice-1")
    assert a.error is None and b.error is None, (a.error, b.error)
    assert len(runs) == 2  # both attempts ran their agent
    winner = a if a.session_id == runs[0] else b
    assert a.session_id == b.session_id == runs[0] and a.reward == b.reward == 1.0
    assert (
        [t.cursor for t in a.samples] == [t.cursor for t in b.samples] == [t.cursor for t in winner.samples]
    )
    stored = [d for d in stream(qwen3) if d["rollout_id"] == "live-twice-1"]
    assert {d["metadata"]["session_id"] for d in stored} == {runs[0]}
    assert len(stored) == len(winner.samples) > 0


async def test_a_failed_live_attempt_is_what_its_retry_reports(qwen3: Stack) -> None:
    """The first attempt's agent fails while its retry runs: the failed finish is the stored run, the
    retry's finish is refused, and both attempts report the failure (neither waits on the other)."""
    a, b, runs = await two_live_attempts(qwen3, "live-failed-1", first_fails=True)
    assert len(runs) == 2
    assert a.session_id == b.session_id == runs[0]
    assert a.termination == b.termination == "error" and a.reward == b.reward == 0.0
    # Which of the two gathered attempts opened its session first is the scheduler's choice: the one that
    # did reports its agent's error, the retry reports the stored run (a failed one) with no error of its own.
    failed, retry = (a, b) if a.error else (b, a)
    assert "the first attempt's sandbox went away" in (failed.error or "")
    assert retry.error is None
    stored = [d for d in stream(qwen3) if d["rollout_id"] == "live-failed-1"]
    assert {d["metadata"]["session_id"] for d in stored} <= {runs[0]}
