"""A real capture stack for the adapter tests: the embedded engine on tiny Qwen3 behind `rlgw serve`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from tests.support.e2e import Stack
from tests.support.procs import REPO


def stored_samples(st: Stack, session_id: str) -> list[dict[str, Any]]:
    """Every sample the store holds for `session_id`, in segment order, read from the trajectory stream."""
    return sorted((d for d in stream(st) if d["session_id"] == session_id), key=lambda d: d["segment"])


def stream(st: Stack) -> list[dict[str, Any]]:
    """Every sample the store holds, in cursor order, read from the trajectory stream."""
    r = httpx.get(st.gateway + "/v1/trajectories", params={"after": 0, "limit": 1000}, timeout=60)
    r.raise_for_status()
    return [orjson.loads(line) for line in r.text.splitlines() if line]


def assert_same_tokens(doc: dict[str, Any], tokens: Any, mask: Any, logprobs: Any) -> None:
    """`tokens`, `mask` and `logprobs` (a trainer's view) equal the stored sample `doc`, exactly."""
    n = doc["response_length"]
    assert list(tokens) == doc["tokens"]
    assert list(mask) == doc["loss_mask"] and len(mask) == n
    # The store keeps float32 logprobs; what a trainer got must be the same float32 values.
    np.testing.assert_array_equal(
        np.asarray(logprobs, dtype=np.float32), np.asarray(doc["rollout_log_probs"], dtype=np.float32)
    )


def run_probe(python: Path, module: str, st: Stack, model: Path, out: Path) -> dict[str, Any]:
    """Run a trainer's probe (`python -m MODULE GATEWAY MODEL OUT`) in its own venv; its JSON report."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run(
        [str(python), "-m", module, st.gateway, str(model), str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())
