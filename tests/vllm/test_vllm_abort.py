"""A generation the gateway gives up on (the agent went away) is aborted on vLLM, not left running.

Slow and skipped unless the vLLM venv is built (`python -m tests.support.vllm_env`).
"""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from rlgw.gateway.engine_client.vllm_backend import VLLMBackend
from tests.support.e2e import Stack

pytestmark = pytest.mark.slow
GENERATED = re.compile(r"^vllm:generation_tokens_total\{[^}]*\} (\S+)$", re.M)
RUNNING = re.compile(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", re.M)


async def _metric(client: httpx.AsyncClient, pattern: re.Pattern[str]) -> float:
    text = (await client.get("/metrics")).text
    return sum(float(v) for v in pattern.findall(text))


async def _until(client: httpx.AsyncClient, pattern: re.Pattern[str], want: float) -> None:
    for _ in range(600):  # a wait for an event, not a speed check: the machine may be loaded
        if await _metric(client, pattern) == want:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"{pattern.pattern} never reached {want}")


async def test_a_cancelled_generation_is_aborted_on_vllm(vllm_qwen3: Stack) -> None:
    backend = VLLMBackend(vllm_qwen3.engine)
    sampling = {"max_new_tokens": 3500, "ignore_eos": True, "temperature": 0.0}
    async with httpx.AsyncClient(base_url=vllm_qwen3.engine, timeout=60) as client:
        generated = await _metric(client, GENERATED)
        task = asyncio.create_task(
            backend.generate(list(range(10, 60)), sampling, rid="gone-1", routing_key="t")
        )
        await _until(client, RUNNING, 1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _until(client, RUNNING, 0.0)
        # Stopped, not finished: far fewer than the 3500 tokens asked for were generated.
        assert await _metric(client, GENERATED) - generated < 3500
    await backend.aclose()
