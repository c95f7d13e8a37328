"""One real coding-agent CLI with the real SGLang serving: pi (its pinned npm release, on the Chat surface)
through `InstalledAgent` against `rlgw serve` in front of the recording proxy and SGLang on
`tests/fixtures/tiny-agent`, with the same checks as its run on the embedded engine
(`tests/scaffolds/test_real_clis.py`): exit 0, `finish`, reward 1.0 (the CLI ran the fixture's tool call),
one sample, and every sample token-exact against SGLang's own output ids, logprobs and teacher-forced
logprobs.

SGLang serves tiny-agent at the fixture's 64k positions with a KV pool that holds a whole CLI prompt
(`--max-total-tokens`; a few MB at this size), through its transformers model implementation
(`--model-impl transformers`): SGLang's native Qwen3 ignores the config's sliding-window layers
(`layer_types`; `sglang/srt/models/qwen3.py` gives its attention no window) and so attends over pi's whole
~2k-token prompt where the fixture was trained on a 256-token window; greedy decoding then degenerated in one
run here ("to to to ..." to the length cap). The transformers implementation reads `layer_types`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rlgw.scaffolds.pi import PiScaffold
from tests.scaffolds.test_real_clis import prefix_for, run_cli
from tests.support.e2e import Stack
from tests.support.procs import FIXTURES
from tests.support.sglang_env import sglang_python, sglang_stack

pytestmark = [pytest.mark.slow, pytest.mark.real_agent]
CONTEXT = 65536
ENGINE_ARGS = (
    "--context-length",
    str(CONTEXT),
    "--max-total-tokens",
    str(CONTEXT),
    "--model-impl",
    "transformers",
)


@pytest.fixture(scope="module")
def sglang_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    model = FIXTURES / "tiny-agent"
    if not (model / "model.safetensors").exists():
        pytest.skip("tests/fixtures/tiny-agent is not built (python -m tests.fixtures.build_agent_fixture)")
    sglang_python()  # skips, naming the build command, before anything starts
    with sglang_stack(model, tmp_path_factory.mktemp("sglang-agent"), engine_args=ENGINE_ARGS) as st:
        yield st


async def test_pi_with_sglang_serving(sglang_agent: Stack, tmp_path: Path) -> None:
    prefix = prefix_for(PiScaffold)
    await run_cli(sglang_agent, PiScaffold(prefix=prefix, api="openai-completions"), tmp_path)  # type: ignore[arg-type]
