"""`rlgw run` on a fresh machine: the CLI, as the README shows it, installs Terminus-2 itself and runs it.

No pre-built venv: the scaffold's venv path is a new temporary directory, so the product's own install
command (`scaffolds/install.py`: Python 3.12 found on PATH or in pyenv, `venv`, pip from the package
index with harbor's committed lock) runs inside the local sandbox, then the agent runs against `rlgw
serve` + `rlgw engine` on the tiny Qwen3 fixture (`real_gateway`). pip's download cache is the user's
(the sandbox's HOME is its own), so a machine that already downloaded harbor's wheels (the `agent_venvs`
build of `test_real_terminus.py`) does not download them again; the venv itself is always built here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlgw.scaffolds.locks import lock_for
from tests.support.real_runs import MODEL, TASKS, UNSOLVED_REWARD

pytestmark = [
    pytest.mark.slow,
    pytest.mark.real_agent,
    # About 7 minutes on a loaded 2-core machine, most of it pip installing harbor.
    pytest.mark.skipif(os.environ.get("RLGW_INSTALL_AGENTS") != "1", reason="RLGW_INSTALL_AGENTS=1 runs it"),
]


def task_line(task_id: str) -> str:
    t = TASKS[task_id]
    assert t.verifier is not None
    verifier = {"command": t.verifier.command, "files": t.verifier.files, "timeout_s": t.verifier.timeout_s}
    return json.dumps({"id": t.id, "instruction": t.instruction, "setup_files": t.setup_files,
                       "verifier": verifier})  # fmt: skip


def test_rlgw_run_installs_terminus_into_a_fresh_venv(real_gateway: str, tmp_path: Path) -> None:
    venv = tmp_path / "fresh-cache" / "terminus-venv"
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(task_line("hello") + "\n")
    argv = [
        sys.executable, "-m", "rlgw.bin.main", "run", "--scaffold", "terminus-2",
        "--scaffold-option", f"venv={json.dumps(str(venv))}", "--tasks", str(tasks),
        "--gateway-url", real_gateway, "--model", MODEL, "--max-turns", "2",
        "--sampling", '{"temperature": 0.7, "max_tokens": 96}', "--install-timeout", "1500",
        "--agent-timeout", "300", "--artifacts-dir", str(tmp_path / "artifacts"), "--json",
    ]  # fmt: skip
    env = {
        **os.environ,
        "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip")),
    }
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=2400)
    print(done.stdout[-3000:], done.stderr[-3000:])
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (result,) = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert result["failed_stage"] is None, result["error"]
    assert result["termination"] == "max_turns" and result["turns"] == 2, result["output_tail"][-2000:]
    assert result["reward"] == UNSOLVED_REWARD
    assert len(result["samples"]) == 1 and result["trainable_tokens"] > 0 and not result["rejects"]
    # The venv the run built holds the pinned harbor, from the interpreter the install found.
    cfg = (venv / "pyvenv.cfg").read_text()
    assert "version_info = 3.12" in cfg or "version = 3.12" in cfg, cfg
    assert list(venv.glob("lib/python3.12/site-packages/harbor-0.26.0.dist-info")), "harbor 0.26.0 missing"
    # Filled from harbor's committed lock, exactly: the marker of that lock, and each pin at its version.
    lock = lock_for("harbor", "0.26.0")
    assert (venv / f".rlgw-lock-{lock.digest()}").exists()
    assert list(venv.glob(f"lib/python3.12/site-packages/litellm-{lock.pins()['litellm']}.dist-info"))
