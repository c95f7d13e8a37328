"""The gateway's fidelity scenarios on the real SGLang (`tests/gateway/test_scenarios.py`'s table).

Each stored sample passes the three token-exactness checks (`tests/support/e2e.py`) against SGLang
itself: mask-1 tokens are SGLang's sampled ids and logprobs for each request id, fed exactly the
series before them; mask-0 tokens are the template's render; recorded logprobs equal SGLang's
teacher-forced `input_token_logprobs` of the final series.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway.test_scenarios import QWEN3, Agent, Scenario
from tests.support import fixture_prompts as fp
from tests.support.e2e import Stack, open_session


@pytest.mark.parametrize(("scenario", "kw", "stream"), QWEN3, ids=lambda v: getattr(v, "__name__", None))
def test_scenarios_on_sglang_are_token_exact(
    sglang_qwen3: Stack, scenario: Scenario, kw: dict[str, Any], stream: bool
) -> None:
    s = open_session(sglang_qwen3, task_id=scenario.__name__)
    agent = Agent(sglang_qwen3, s, tools=fp.TOOLS, kw=kw, stream=stream)
    agent.check(scenario(agent))
