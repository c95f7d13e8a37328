"""Claude Code, Codex, opencode, qwen-code, pi (on Chat, Messages and Responses), Gemini CLI (on the
Gemini surface), Cline, Copilot CLI, Kimi Code, OpenClaw and Kilo Code, pinned npm releases, run for real
through `rlgw serve` on tiny-agent; and Claude Code in a project whose main agent delegates to a subagent
with its `Agent` tool.

Each run goes through the product's own path: `InstalledAgent` with the CLI's scaffold on a local
sandbox, the scaffold's install command putting the npm package into a cache prefix
(`~/.cache/rlgw/agents/npm-<cli>-<version>`, reused once there; about 2 minutes for the three
on a clean machine, as CI is), the CLI on its default settings against a capture
session of `rlgw serve` in front of a recording proxy and `rlgw engine` serving
`tests/fixtures/tiny-agent` (greedy: the session's sampling). The fixture answers the task with one
call of the CLI's tool, which the CLI executes (the verifier pays 1.0 only if `hello.txt` holds
`hello`), then a short answer. Checked: exit 0, `finish`, reward 1.0, the CLI's call among what the model
said (`CALLS`), one sample per conversation (the main one holds the call and the answer), and every sample
token-exact: mask-1 spans are the
engine's output ids and logprobs for their request, the engine was fed exactly the tokens before
each, the prompt and each mask-0 span are canonical tokenizations of the template text they decode
to, and the recorded logprobs equal the engine's teacher-forced ones.

Claude Code's first request carries a mid-conversation system message and Codex's carries
`namespace` and hosted tools: both were a 400 before the Messages and Responses surfaces served them.

qwen-code's pin is 0.24.4, on Node 24 from npm (installed by the scaffold into the CLI's prefix), as are
Kimi Code's and OpenClaw's.

Samples per run (`SAMPLES`): one per conversation, in the order they opened (issue 24 part 3): a side
conversation (opencode's title request) or a subagent (Claude Code's `Agent`) opens its own, cause
`new_conversation`, and the main conversation continued after it is appended in place.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rlgw.scaffolds.claude_code import ClaudeCodeScaffold
from rlgw.scaffolds.cline import ClineScaffold
from rlgw.scaffolds.codex import CodexScaffold
from rlgw.scaffolds.copilot import CopilotScaffold
from rlgw.scaffolds.gemini_cli import GeminiCliScaffold
from rlgw.scaffolds.kilo import KiloScaffold
from rlgw.scaffolds.kimi_code import KimiCodeScaffold
from rlgw.scaffolds.node_cli import NodeCliScaffold
from rlgw.scaffolds.openclaw import OpenClawScaffold
from rlgw.scaffolds.opencode import OpencodeScaffold
from rlgw.scaffolds.pi import PiScaffold
from rlgw.scaffolds.qwen_code import QwenCodeScaffold
from rlgw.scaffolds.termination import TerminationReason
from tests.fixtures.build_agent_fixture import ANSWER, CALLS, SETUP_FILES, TASKS
from tests.support.agent_venvs import cache_root
from tests.support.e2e import Stack
from tests.support.tiny_agent_runs import run_on_tiny_agent

pytestmark = [pytest.mark.slow, pytest.mark.real_agent]

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
    "cline": [["start"]],
    "copilot": [["start"]],  # offline: no side call
    "kimi-code": [["start"]],
    "kilo": [["start", "new_conversation"]],  # opencode's fork: its title request too
    # main (the Agent call, then what tiny-agent makes of the hand-back, whose agent id and timings vary from
    # run to run: an answer, or first a call Claude Code refuses, sometimes cut inside its arguments), the
    # subagent (Bash, the result, an answer)
    "claude-code-agent": [["start", "new_conversation"]],
}


def prefix_for(scaffold_cls: type[NodeCliScaffold]) -> str:
    """The cache prefix of the CLI's pinned version (the scaffold installs it there if absent)."""
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed (.ci/run installs Debian's nodejs and npm)")
    return str(cache_root() / f"npm-{scaffold_cls.name}-{scaffold_cls.default_version}")


async def run_cli(st: Stack, scaffold: NodeCliScaffold, tmp_path: Path, run: str | None = None) -> None:
    run = run or scaffold.name
    done = await run_on_tiny_agent(st, scaffold, tmp_path, run, TASKS[run], SETUP_FILES.get(run, {}))
    r = done.result
    assert r.failed_stage is None and r.exit_code == 0, done.detail
    assert r.termination is TerminationReason.FINISH, done.detail
    assert r.reward == 1.0, done.detail  # the CLI ran the fixture's tool call in the workspace
    assert done.said(CALLS[run]), done.replies
    assert done.causes in SAMPLES[run] and not r.rejects, (done.causes, r.rejects)
    assert done.conversations == list(range(len(done.causes)))
    assert max(done.spans) >= 2, done.spans  # the main conversation: the call, then the answer
    assert done.leftovers == []


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


async def test_cline(agent_stack: Stack, tmp_path: Path) -> None:
    """Cline runs its `run_commands` tool; its loop ends at the answer (`run_result` `completed`)."""
    await run_cli(agent_stack, ClineScaffold(prefix=prefix_for(ClineScaffold)), tmp_path)


async def test_copilot(agent_stack: Stack, tmp_path: Path) -> None:
    """Copilot CLI offline on the session's Chat surface runs its `bash` tool: one conversation."""
    await run_cli(agent_stack, CopilotScaffold(prefix=prefix_for(CopilotScaffold)), tmp_path)


async def test_kimi_code(agent_stack: Stack, tmp_path: Path) -> None:
    """Kimi Code on Node 24 from npm, print mode, given Claude Code's task (its tools are Claude Code's)."""
    await run_cli(agent_stack, KimiCodeScaffold(prefix=prefix_for(KimiCodeScaffold)), tmp_path)


async def test_kilo(agent_stack: Stack, tmp_path: Path) -> None:
    """Kilo Code (opencode's fork: a `write` tool among its own) on the session's Chat surface."""
    await run_cli(agent_stack, KiloScaffold(prefix=prefix_for(KiloScaffold)), tmp_path)


async def test_openclaw(agent_stack: Stack, tmp_path: Path) -> None:
    """OpenClaw on Node 24 from npm (the scaffold installs it into the CLI's prefix first), one isolated turn
    with its `write` tool. Its prompt ends with the minute, the run's session id and the machine's host and
    kernel, which the fixture was taught to read past.

    OpenClaw sends its internal context (active exec sessions, subagents) as the last user message of every
    request, so the next request does not extend the one before: the call's turn is followed by the context
    block in the first request and by the tool result in the second. The gateway stores what each prompt was:
    two samples of one conversation, the second a `rewrite` at the assistant's message."""
    scaffold = OpenClawScaffold(prefix=prefix_for(OpenClawScaffold))
    done = await run_on_tiny_agent(agent_stack, scaffold, tmp_path, "openclaw", TASKS["openclaw"])
    r = done.result
    assert r.failed_stage is None and r.exit_code == 0, done.detail
    assert r.termination is TerminationReason.FINISH and r.reward == 1.0 and not r.rejects, done.detail
    assert done.said(CALLS["openclaw"]) and done.said(ANSWER), done.replies
    assert done.causes == ["start", "rewrite"] and done.spans == [1, 1], (done.causes, done.spans)
    assert done.cause_details[1] == "history rewritten at message 2 (role 'assistant')", done.cause_details
    assert done.conversations == [0, 0] and done.leftovers == []
