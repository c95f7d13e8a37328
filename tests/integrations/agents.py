"""Agent functions the adapter tests run through a capture session (importable by dotted path).

`rewrite_agent` is the shared fixture conversation: a tool loop on the weather prompt (a call, its
result, an answer), then the agent rewrites its history into a summary and asks again, so the
session stores two segments (causes `start` and `rewrite`) of one rollout. Greedy decoding of the
tiny Qwen3 fixture makes it deterministic. `one_segment_agent` is the weather loop alone, graded 0.0;
`failing_agent` makes one model call and raises.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlgw.gateway.trajectories.client import SessionInfo
from rlgw.integrations.rollout import ChatLoop, TaskRequest
from tests.support import fixture_prompts as fp

# The summary keeps the loop's opening (no system message): a rewrite of its conversation, not a new one.
SUMMARY: list[dict[str, Any]] = [
    {"role": "user", "content": "A summary of the work so far follows."},
    {"role": "user", "content": "Earlier: it is sunny in Paris."},
    {"role": "assistant", "content": "Noted."},
    {"role": "user", "content": "What is the weather in Berlin?"},
]


def _weather(args: dict[str, Any]) -> str:
    return fp.weather_result(args["city"], "sunny", 20)


LOOP = ChatLoop(
    tools=fp.TOOLS,
    handlers={"get_weather": _weather, "list_files": lambda _: '{"files": ["a.txt"]}'},
    max_turns=3,
    chat_template_kwargs={"enable_thinking": False},
)


async def rewrite_agent(session: SessionInfo, request: TaskRequest) -> float:
    """Two segments: the weather tool loop, then the same loop on a rewritten (summarized) history."""
    await LOOP(session, dataclasses.replace(request, prompt=fp.WEATHER))
    await LOOP(session, dataclasses.replace(request, prompt=SUMMARY))
    return 1.0


async def failing_agent(session: SessionInfo, request: TaskRequest) -> float:
    """One model call, then the agent crashes."""
    await dataclasses.replace(LOOP, max_turns=1)(session, dataclasses.replace(request, prompt=fp.PLAIN))
    raise RuntimeError("the sandbox went away")


async def one_segment_agent(session: SessionInfo, request: TaskRequest) -> float:
    """One segment (the weather tool loop) graded 0.0: the other member of a GRPO group."""
    await LOOP(session, dataclasses.replace(request, prompt=fp.WEATHER))
    return 0.0
