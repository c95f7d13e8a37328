"""An agent for the trainer examples: a chat loop with one tool and a verifiable reward.

Point an adapter's `runner` at `weather_agent:agent` (with this folder on PYTHONPATH). Any async
function `(session, request) -> reward` works the same way: talk to `session.base_url` with
`session.api_key` as an OpenAI endpoint (or hand them to your agent CLI), return the verifier's reward.
"""

from __future__ import annotations

import json
from typing import Any

from rlgw.integrations.rollout import ChatLoop, TaskRequest

GET_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def get_weather(args: dict[str, Any]) -> str:
    """The tool: a fixed forecast (a real agent would call a service or a sandbox here)."""
    return json.dumps({"city": args["city"], "conditions": "sunny", "temp_c": 20})


def reward(messages: list[dict[str, Any]], request: TaskRequest) -> float:
    """1.0 when the last answer names the temperature the tool reported."""
    last = messages[-1]
    return 1.0 if last.get("role") == "assistant" and "20" in (last.get("content") or "") else 0.0


agent = ChatLoop(tools=[GET_WEATHER], handlers={"get_weather": get_weather}, reward=reward, max_turns=4)
