"""A trainer's retried rollout (same rollout id, its first answer lost) is served from the stored finish:
`AgentRunner` gets the stored outcome back, the agent does not run again, and nothing is stored twice."""

from __future__ import annotations

from rlgw.gateway.trajectories.client import GatewayClient, SessionInfo
from rlgw.integrations.rollout import AgentRunner, TaskRequest, run_rollout
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
