"""LiteLLM's proxy as a peer for bench/gateway.py: a plain OpenAI pass-through to the stub engine.

LiteLLM lives in its own virtual environment (`~/.cache/rlgw/peers/litellm`, about 750 MB,
built on first use with `pip install 'litellm[proxy]'`, about 2 minutes) so that none of its
dependencies reach rlgw's. It is configured with one model routed to the stub's
`/v1/chat/completions`, no database (so no spend tracking) and the local price map (no
download at start).
"""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.procs import free_port, wait_healthy

VENV = Path(os.environ.get("RLGW_CACHE_DIR") or Path.home() / ".cache" / "rlgw") / "peers" / "litellm"
PACKAGE = "litellm[proxy]"


def drain(proc: subprocess.Popen) -> None:
    """Read a child's output in a daemon thread (a full pipe would block the child's logging);
    the last lines stay readable as `proc.output_tail` for error messages."""
    tail: collections.deque[str] = collections.deque(maxlen=50)
    proc.output_tail = tail  # type: ignore[attr-defined]

    def run() -> None:
        for line in proc.stdout or ():
            tail.append(line)

    threading.Thread(target=run, daemon=True).start()


@dataclass(frozen=True)
class Peer:
    """A running LiteLLM proxy: its base URL (OpenAI routes under /v1), key and process id."""

    url: str
    key: str
    pid: int


def ensure_venv() -> Path:
    """The `litellm` executable, installing LiteLLM into its own venv on first use."""
    exe = VENV / "bin" / "litellm"
    if exe.is_file():
        return exe
    print(f"installing {PACKAGE} into {VENV} (first use, about 2 minutes)", file=sys.stderr)
    VENV.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", PACKAGE], check=True)
    return exe


@contextlib.contextmanager
def litellm_proxy(stub_url: str, *, workers: int = 1) -> Iterator[Peer]:
    """LiteLLM's proxy in front of the stub engine's OpenAI endpoint, for as long as the block runs."""
    exe = ensure_venv()
    port = free_port()
    key = "sk-bench-" + secrets.token_hex(16)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(
            "model_list:\n"
            "  - model_name: stub\n"
            "    litellm_params:\n"
            "      model: openai/stub\n"
            f"      api_base: {stub_url}/v1\n"
            "      api_key: unused\n"
        )
        env = {**os.environ, "LITELLM_MASTER_KEY": key, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        cmd = [str(exe), "--config", str(config), "--port", str(port), "--num_workers", str(workers)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        drain(proc)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url + "/health/liveliness", proc)
            yield Peer(url=url, key=key, pid=proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
