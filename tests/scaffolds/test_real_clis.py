"""Claude Code, Codex, opencode, qwen-code, pi (on Chat, Messages and Responses) and Gemini CLI (on the
Gemini surface), pinned npm releases, run for real through `rlgw serve` on tiny-agent; and Claude Code in a
project whose main agent delegates to a subagent with its `Agent` tool.

Each run goes through the product's own path: `InstalledAgent` with the CLI's scaffold on a local
sandbox, the scaffold's install command putting the npm package into a cache prefix
(`~/.cache/rlgw/agents/npm-<cli>-<version>`, reused once there; about 2 minutes for the three
on a clean machine, as CI is), the CLI on its default settings against a capture
session of `rlgw serve` in front of a recording proxy and `rlgw engine` serving
`tests/fixtures/tiny-agent` (greedy: the session's sampling). The fixture answers the task with one
call of the CLI's tool, which the CLI executes (the verifier pays 1.0 only if `hello.txt` holds
`hello`), then a short answer. Checked: exit 0, `finish`, reward 1.0, one sample per conversation
(the main one holds the call and the answer), and every sample token-exact: mask-1 spans are the
engine's output ids and logprobs for their request, the engine was fed exactly the tokens before
each, the prompt and each mask-0 span are canonical tokenizations of the template text they decode
to, and the recorded logprobs equal the engine's teacher-forced ones.

Claude Code's first request carries a mid-conversation system message and Codex's carries
`namespace` and hosted tools: both were a 400 before the Messages and Responses surfaces served them.

Samples per run (`SAMPLES`): one per conversation, in the order they opened (issue 24 part 3): a side
conversation (opencode's title request) or a subagent (Claude Code's `Agent`) opens its own, cause
`new_conversation`, and the main conversation continued after it is appended in place.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlgw.gateway.sample import validate_sample
from rlgw.gateway.trajectories.client import GatewayClient
from rlgw.scaffolds.agent import AgentConfig, InstalledAgent
from rlgw.scaffolds.claude_code import ClaudeCodeScaffold
from rlgw.scaffolds.codex import CodexScaffold
from rlgw.scaffolds.gemini_cli import GeminiCliScaffold
from rlgw.scaffolds.node_cli import NodeCliScaffold
from rlgw.scaffolds.opencode import OpencodeScaffold
from rlgw.scaffolds.pi import PiScaffold
from rlgw.scaffolds.qwen_code import QwenCodeScaffold
from rlgw.scaffolds.tasks import Task, Verifier
from rlgw.scaffolds.termination import TerminationReason
from tests.fixtures.build_agent_fixture import SETUP_FILES, TASKS
from tests.support.agent_venvs import cache_root
from tests.support.e2e import Stack, check_engine_spans, check_forced_logprobs, stack, stored
from tests.support.procs import FIXTURES
from tests.support.real_runs import Sandboxes

pytestmark = [pytest.mark.slow, pytest.mark.real_agent]

MODEL = FIXTURES / "tiny-agent"
VERIFY = (
    "python3 -c \"import pathlib, sys; p = pathlib.Path('hello.txt'); "
    "sys.exit(0 if p.exists() and p.read_text().strip() == 'hello' else 1)\""
)
# The segment causes of the samples each run stores on main's gateway (one list per outcome the timing of its
# requests allows). With conversations (issue 24 part 3) a side conversation's cause becomes
# `new_conversation` and the subagent run stores one sample per conversation: update these when that lands.
SAMPLES: dict[str, list[list[str]]] = {
    "claude-code": [["start"]],
    "codex": [["start"]],
    # Its title request runs beside the main conversation (before it, or between its call and answer).
    "opencode": [["start", "new_conversation"]],
    "qwen-code": [["start"]],
    "pi": [["start"]],
    "gemini-cli": [["start"]],
    # main (the Agent call, then what tiny-agent makes of the hand-back, whose agent id and timings vary from
    # run to run: an answer, or first a call Claude Code refuses, sometimes cut inside its arguments), the
    # subagent (Bash, the result, an answer)
    "claude-code-agent": [["start", "new_conversation"]],
}


# Gemini CLI is qwen-code's upstream (the same tools, a prompt of the same shape): the fixture, not trained on
# Gemini CLI's requests, answers its run with qwen-code's call when given qwen-code's instruction.
INSTRUCTIONS = {**TASKS, "gemini-cli": TASKS["qwen-code"]}


@pytest.fixture(scope="module")
def agent_stack(tmp_path_factory: pytest.TempPathFactory):
    """Engine on tiny-agent, the recording proxy and `rlgw serve` (the CLIs' prompts need its 64k context)."""
    if not (MODEL / "model.safetensors").exists():
        pytest.skip("tests/fixtures/tiny-agent is not built (python -m tests.fixtures.build_agent_fixture)")
    with stack(MODEL, tmp_path_factory.mktemp("cli-gw")) as st:
        yield st


def prefix_for(scaffold_cls: type[NodeCliScaffold]) -> str:
    """The cache prefix of the CLI's pinned version (the scaffold installs it there if absent)."""
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed (.ci/run installs Debian's nodejs and npm)")
    return str(cache_root() / f"npm-{scaffold_cls.name}-{scaffold_cls.default_version}")


def check_token_exact(st: Stack, doc: dict[str, Any]) -> int:
    """The fidelity checks of `tests/gateway/test_scenarios.py` that need no copy of the agent's requests.

    Mask-0 spans are checked as canonical tokenizations of the template text they decode to (the agent's
    requests are Anthropic or Responses bodies the gateway translates). Returns the number of sampled spans.
    """
    tok = st.tokenizer
    tokens = np.asarray(doc["tokens"])
    runs = check_engine_spans(st, doc)
    assert runs
    spans = [(0, runs[0][0])] + [(runs[k - 1][1], runs[k][0]) for k in range(1, len(runs))]
    for a, b in spans:
        text = tok.decode(tokens[a:b].tolist())
        assert tokens[a:b].tolist() == tok.encode(text, add_special_tokens=False)
        assert "<|im_start|>assistant\n" in text[-40:], text[-200:]
    check_forced_logprobs(st, doc, runs)
    return len(runs)


async def run_cli(st: Stack, scaffold: NodeCliScaffold, tmp_path: Path, run: str | None = None) -> None:
    run = run or scaffold.name
    files = {"README.md": "notes\n", **SETUP_FILES.get(run, {})}
    task = Task(f"{run}-hello", INSTRUCTIONS[run], setup_files=files, verifier=Verifier(VERIFY, timeout_s=60))
    sandboxes = Sandboxes(tmp_path)
    config = AgentConfig(mode="capture", model="tiny-agent", max_turns=4, agent_timeout_s=900,
                         install_timeout_s=1800, sampling={"temperature": 0.0},
                         artifacts_dir=tmp_path / "artifacts")  # fmt: skip
    async with GatewayClient(st.gateway) as client:
        r = await InstalledAgent(scaffold, sandboxes, client, config).run(task)
        docs = [(await client.get_trajectory(s["cursor"])).sample for s in r.samples]
    detail = f"{r.termination} {r.failed_stage} {r.error}\n{r.detail}\n{r.output_tail[-3000:]}"
    spans = [check_token_exact(st, stored(st, s["cursor"])) for s in r.samples]
    causes = [d.metadata.get("segment_cause") for d in docs]
    details = [d.metadata.get("segment_cause_detail") for d in docs[1:]]  # why each later sample began
    print(f"REAL-CLI {run:<18} exit={r.exit_code} reason={r.termination} reward={r.reward} "
          f"samples={len(r.samples)} requests_per_sample={spans} causes={causes} "
          f"wall={r.duration_s:.0f}s details={details}")  # fmt: skip
    assert r.failed_stage is None and r.exit_code == 0, detail
    assert r.termination is TerminationReason.FINISH, detail
    assert r.reward == 1.0, detail  # the CLI ran the fixture's tool call in the workspace
    assert causes in SAMPLES[run] and not r.rejects, (causes, r.rejects)
    assert [d.metadata["conversation"] for d in docs] == list(range(len(docs)))
    for d in docs:
        validate_sample(d)
    assert max(spans) >= 2, spans  # the main conversation: the call, then the answer
    assert sandboxes.leftovers() == []


async def test_claude_code(agent_stack: Stack, tmp_path: Path) -> None:
    prefix = prefix_for(ClaudeCodeScaffold)
    await run_cli(agent_stack, ClaudeCodeScaffold(prefix=prefix), tmp_path)


async def test_codex(agent_stack: Stack, tmp_path: Path) -> None:
    prefix = prefix_for(CodexScaffold)
    await run_cli(agent_stack, CodexScaffold(prefix=prefix), tmp_path)


async def test_opencode(agent_stack: Stack, tmp_path: Path) -> None:
    prefix = prefix_for(OpencodeScaffold)
    await run_cli(agent_stack, OpencodeScaffold(prefix=prefix), tmp_path)


async def test_qwen_code(agent_stack: Stack, tmp_path: Path) -> None:
    prefix = prefix_for(QwenCodeScaffold)
    await run_cli(agent_stack, QwenCodeScaffold(prefix=prefix), tmp_path)


async def test_gemini_cli(agent_stack: Stack, tmp_path: Path) -> None:
    prefix = prefix_for(GeminiCliScaffold)
    await run_cli(agent_stack, GeminiCliScaffold(prefix=prefix), tmp_path)


@pytest.mark.parametrize("api", ["openai-completions", "anthropic-messages", "openai-responses"])
async def test_pi(agent_stack: Stack, tmp_path: Path, api: str) -> None:
    prefix = prefix_for(PiScaffold)
    await run_cli(agent_stack, PiScaffold(prefix=prefix, api=api), tmp_path)  # type: ignore[arg-type]


async def test_claude_code_subagent(agent_stack: Stack, tmp_path: Path) -> None:
    """The project defines a `writer` subagent (Bash only) and says to delegate file writes to it: the main
    agent calls `Agent`, the subagent runs its own conversation (its own system prompt and tools: `Bash`,
    the result, an answer), and the main agent answers after it."""
    prefix = prefix_for(ClaudeCodeScaffold)
    await run_cli(agent_stack, ClaudeCodeScaffold(prefix=prefix), tmp_path, run="claude-code-agent")
