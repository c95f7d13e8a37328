"""The whole path: rlgw-mini in a local sandbox -> real gateway process -> embedded engine (tiny Qwen3).

Capture stores a sample that passes the hand-off contract and carries the run's reward and
termination reason; eval records nothing. The tiny model's replies are whatever it emits;
the point is the path, not the task.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import orjson
import pytest

from rlgw.gateway.sample import validate_sample
from rlgw.gateway.trajectories.client import GatewayClient
from rlgw.sandboxes.local import LocalSandbox
from rlgw.scaffolds.agent import AgentConfig, InstalledAgent
from rlgw.scaffolds.mini import MiniScaffold
from rlgw.scaffolds.tasks import Task, Verifier
from tests.support.procs import engine_server, free_port, rlgw_process

TASK = Task(
    "weather",
    "What is the weather in Paris?",
    setup_files={"README.md": "notes\n"},
    verifier=Verifier("test -f README.md && echo '{\"reward\": 0.5}' > $RLGW_REWARD_DIR/reward.json"),
)


@pytest.fixture(scope="module")
def gateway_url(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory):
    if not (tiny_qwen3 / "model.safetensors").exists():
        pytest.skip("tests/fixtures/tiny-qwen3 is not built")
    data = tmp_path_factory.mktemp("gw")
    with engine_server(tiny_qwen3) as engine:
        port = free_port()
        args = ["serve", "--engine-url", engine, "--port", str(port), "--data-dir", str(data)]
        with rlgw_process(args, "/health", port) as url:
            yield url


def agent(client: GatewayClient, mode: str) -> InstalledAgent:
    return InstalledAgent(
        MiniScaffold(python=sys.executable, max_tokens=64),
        LocalSandbox,
        client,
        AgentConfig(mode=mode, model="tiny-qwen3", max_turns=2, agent_timeout_s=240),
    )


@pytest.mark.slow
async def test_capture_stores_a_valid_sample_with_reward_and_reason(gateway_url: str) -> None:
    async with GatewayClient(gateway_url) as client:
        result = await agent(client, "capture").run(TASK, rollout_id="e2e-1")
        assert result.failed_stage is None, result.error
        assert result.reward == 0.5 and result.turns >= 1
        assert result.samples and result.trainable_tokens > 0, (result.termination, result.output_tail)
        stored = await client.get_trajectory(result.samples[0]["cursor"])
        sample = stored.sample
        validate_sample(sample)
        assert sample.reward == 0.5 and sample.rollout_id == "e2e-1"
        assert str(sample.status) == result.status
        assert sample.metadata.get("termination_reason") == str(result.termination)

        # Run again with the same rollout id (Ray's retry of a worker that died after the finish was
        # stored): the stored result comes back, the agent does not run, nothing is stored twice.
        again = await agent(client, "capture").run(TASK, rollout_id="e2e-1")
        assert again.recovered and again.failed_stage is None, again.error
        assert (again.session_id, again.samples) == (result.session_id, result.samples)
        assert (again.reward, again.status, again.termination) == (0.5, result.status, result.termination)
        async with httpx.AsyncClient() as http:
            page = await http.get(gateway_url + "/v1/trajectories", params={"limit": 1000, "wait": 0})
        stream = [orjson.loads(line) for line in page.raise_for_status().content.splitlines()]
        assert [d["cursor"] for d in stream if d["rollout_id"] == "e2e-1"] == [
            s["cursor"] for s in result.samples
        ]


@pytest.mark.slow
async def test_eval_records_nothing(gateway_url: str) -> None:
    async with GatewayClient(gateway_url) as client:
        result = await agent(client, "eval").run(TASK)
        assert result.failed_stage is None, result.error
        assert result.reward == 0.5 and result.turns >= 1
        assert result.samples == [] and result.trainable_tokens == 0
