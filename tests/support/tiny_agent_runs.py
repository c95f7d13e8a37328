"""Real harness runs on `tests/fixtures/tiny-agent` through `rlgw serve`, and the token-exactness checks.

One run: the harness's scaffold through `InstalledAgent` on local sandboxes against a capture
session of the `agent_stack` gateway (engine on tiny-agent, greedy, behind a recording proxy), the
task's verifier paying 1.0 only if `hello.txt` holds `hello`. Every stored sample is then checked
token-exact: mask-1 spans are the engine's output ids and logprobs for their request, the engine was
fed exactly the tokens before each, the prompt and each mask-0 span are canonical tokenizations of
the template text they decode to, and the recorded logprobs equal the engine's teacher-forced ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlgw.gateway.sample import validate_sample
from rlgw.gateway.trajectories.client import GatewayClient
from rlgw.scaffolds.agent import AgentConfig, InstalledAgent, RunResult
from rlgw.scaffolds.scaffold import InstalledScaffold
from rlgw.scaffolds.tasks import Task, Verifier
from tests.fixtures.build_agent_fixture import call_text
from tests.support.e2e import Stack, check_engine_spans, check_forced_logprobs, mask_runs, stored
from tests.support.real_runs import Sandboxes

VERIFY = (
    "python3 -c \"import pathlib, sys; p = pathlib.Path('hello.txt'); "
    "sys.exit(0 if p.exists() and p.read_text().strip() == 'hello' else 1)\""
)


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


@dataclass
class AgentRun:
    """What one run stored: the runner's result, each sample's requests, segment cause (and what the gateway
    says about it: `cause_details`), leftovers, and what the model said (`replies`: every sampled span's
    text, sample by sample, as decoded with special tokens: a call is its `<tool_call>` block)."""

    result: RunResult
    spans: list[int]
    causes: list[str | None]
    cause_details: list[str | None]
    conversations: list[int]
    leftovers: list[str]
    replies: list[str]

    def said(self, reply: dict[str, Any] | str) -> bool:
        """Whether a sampled span is `reply`: a text, or a call (name, arguments) as its `<tool_call>`."""
        text = reply if isinstance(reply, str) else call_text(reply)
        return any(r.removesuffix("<|im_end|>") == text for r in self.replies)

    @property
    def detail(self) -> str:
        r = self.result
        return f"{r.termination} {r.failed_stage} {r.error}\n{r.detail}\n{r.output_tail[-3000:]}"

    def line(self, run: str) -> str:
        """One row of the harness table (printed with -s)."""
        r = self.result
        return (f"REAL-CLI {run:<18} exit={r.exit_code} reason={r.termination} reward={r.reward} "
                f"samples={len(r.samples)} requests_per_sample={self.spans} causes={self.causes} "
                f"wall={r.duration_s:.0f}s")  # fmt: skip


async def run_on_tiny_agent(
    st: Stack, scaffold: InstalledScaffold, tmp_path: Path, run: str, instruction: str,
    files: dict[str, str] | None = None, *, max_turns: int = 4,
) -> AgentRun:  # fmt: skip
    """`scaffold` on `instruction` in a workspace holding `files` (and a README), every sample checked."""
    task = Task(f"{run}-hello", instruction, setup_files={"README.md": "notes\n", **(files or {})},
                verifier=Verifier(VERIFY, timeout_s=60))  # fmt: skip
    sandboxes = Sandboxes(tmp_path)
    # Every taught run takes seconds: a harness left waiting (Kilo waits for the network after a request fails
    # for a network reason) fails its test in 5 minutes, not 15.
    config = AgentConfig(mode="capture", model="tiny-agent", max_turns=max_turns, agent_timeout_s=300,
                         install_timeout_s=1800, sampling={"temperature": 0.0},
                         artifacts_dir=tmp_path / "artifacts")  # fmt: skip
    async with GatewayClient(st.gateway) as client:
        r = await InstalledAgent(scaffold, sandboxes, client, config).run(task)
        docs = [(await client.get_trajectory(s["cursor"])).sample for s in r.samples]
    for d in docs:
        validate_sample(d)
    raw = [stored(st, s["cursor"]) for s in r.samples]
    spans = [check_token_exact(st, doc) for doc in raw]
    causes = [d.metadata.get("segment_cause") for d in docs]
    details = [d.metadata.get("segment_cause_detail") for d in docs]
    conversations = [d.metadata["conversation"] for d in docs]
    done = AgentRun(r, spans, causes, details, conversations, sandboxes.leftovers(), [
        st.tokenizer.decode(doc["tokens"][len(doc["tokens"]) - doc["response_length"] :][a:b])
        for doc in raw for a, b in mask_runs(np.asarray(doc["loss_mask"]))
    ])  # fmt: skip
    print(done.line(run))
    return done
