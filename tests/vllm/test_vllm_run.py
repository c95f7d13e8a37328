"""`rlgw run` of an installed coding CLI with vLLM serving: pi (npm `@mariozechner/pi-coding-agent`) through
`rlgw serve --engine-kind vllm` in front of a real vLLM server on tiny-agent with 64-wide heads.

The CLI is the product's own path: `rlgw run --scaffold pi` installs the pinned npm release into the
shared agent cache (`~/.cache/rlgw/agents`, reused once there), runs it headless in a local sandbox
against a capture session, and the verifier grades the workspace. tiny-agent is overfitted to answer
pi's real prompt with one `bash` call (`echo hello > hello.txt`) and then a short answer, so greedy
decoding on vLLM (which computes the same function as the fixture, `tests/support/wide_heads.py`)
solves the task. Checked: the run's status is what the agent did (exit 0, `finish`, reward 1.0: the
file is there), and every stored sample is token-exact against vLLM itself (mask-1 spans are vLLM's
sampled ids and logprobs for their request, fed exactly the series before them; mask-0 spans are
canonical tokenizations of the template text; recorded logprobs equal vLLM's teacher-forced ones).
Long (a second vLLM start-up, minutes: `RLGW_LONG=1`) and skipped unless the vLLM venv is built
(`python -m tests.support.vllm_env`) and npm is on PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlgw.gateway.sample import Sample, validate_sample
from rlgw.scaffolds.pi import PiScaffold
from tests.fixtures.build_agent_fixture import TASKS
from tests.support.agent_venvs import cache_root
from tests.support.e2e import Stack, stored
from tests.support.procs import FIXTURES, REPO
from tests.support.tiny_agent_runs import VERIFY, check_token_exact
from tests.support.vllm_env import vllm_python, vllm_stack
from tests.support.wide_heads import widen_heads

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.real_agent]

AGENT = FIXTURES / "tiny-agent"


@pytest.fixture(scope="module")
def vllm_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """vLLM on tiny-agent with 64-wide heads (its 64k context: the CLI's prompt is thousands of tokens)."""
    if not (AGENT / "model.safetensors").exists():
        pytest.skip("tests/fixtures/tiny-agent is not built (python -m tests.fixtures.build_agent_fixture)")
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed (.ci/run installs Debian's nodejs and npm)")
    vllm_python()
    tmp = tmp_path_factory.mktemp("vllm-agent")
    model = widen_heads(AGENT, tmp / "tiny-agent-hd64")
    with vllm_stack(model, tmp, engine_args=["--max-model-len", "65536"]) as st:
        yield st


def test_rlgw_run_of_pi_on_vllm(vllm_agent: Stack, tmp_path: Path) -> None:
    task = {
        "id": "pi-hello",
        "instruction": TASKS["pi"],
        "setup_files": {"README.md": "notes\n"},
        "verifier": {"command": VERIFY, "timeout_s": 60},
    }
    (tmp_path / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    prefix = cache_root() / f"npm-{PiScaffold.name}-{PiScaffold.default_version}"
    argv = [
        sys.executable, "-m", "rlgw.bin.main", "run", "--scaffold", "pi",
        "--scaffold-option", f"prefix={json.dumps(str(prefix))}", "--tasks", str(tmp_path / "tasks.jsonl"),
        "--gateway-url", vllm_agent.gateway, "--model", "tiny-agent", "--max-turns", "4",
        "--sampling", '{"temperature": 0.0}', "--install-timeout", "1200", "--agent-timeout", "900",
        "--artifacts-dir", str(tmp_path / "artifacts"), "--json",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=env, timeout=2400)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (result,) = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    tail = result["output_tail"][-3000:]
    detail = f"{result['termination']} {result['failed_stage']} {result['error']}\n{tail}"
    # The status is what pi did: it ran the fixture's bash call (the verifier found hello.txt) and answered.
    assert result["failed_stage"] is None and result["exit_code"] == 0, detail
    assert result["termination"] == "finish" and result["reward"] == 1.0, detail
    assert len(result["samples"]) == 1 and result["trainable_tokens"] > 0 and not result["rejects"]
    doc = stored(vllm_agent, result["samples"][0]["cursor"])
    validate_sample(Sample.from_dict(doc))
    assert doc["metadata"]["engine"]["kind"] == "vllm"
    spans = check_token_exact(vllm_agent, doc)
    assert spans >= 2, spans  # the call, then the answer, each sampled by vLLM
    print(f"rlgw run pi on vLLM: reward={result['reward']} spans={spans} wall={result['duration_s']:.0f}s")
