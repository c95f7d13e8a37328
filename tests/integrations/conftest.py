"""A real capture stack for the adapter tests: the embedded engine on tiny Qwen3 behind `rlgw serve`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from tests.support.e2e import Stack, stack


@pytest.fixture(scope="module")
def qwen3(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with stack(tiny_qwen3, tmp_path_factory.mktemp("store-integrations")) as s:
        yield s


def stored_samples(st: Stack, session_id: str) -> list[dict[str, Any]]:
    """Every sample the store holds for `session_id`, in segment order, read from the trajectory stream."""
    r = httpx.get(st.gateway + "/v1/trajectories", params={"after": 0, "limit": 1000}, timeout=60)
    r.raise_for_status()
    docs = [orjson.loads(line) for line in r.text.splitlines() if line]
    return sorted((d for d in docs if d["session_id"] == session_id), key=lambda d: d["segment"])


def assert_same_tokens(doc: dict[str, Any], tokens: Any, mask: Any, logprobs: Any) -> None:
    """`tokens`, `mask` and `logprobs` (a trainer's view) equal the stored sample `doc`, exactly."""
    n = doc["response_length"]
    assert list(tokens) == doc["tokens"]
    assert list(mask) == doc["loss_mask"] and len(mask) == n
    # The store keeps float32 logprobs; what a trainer got must be the same float32 values.
    np.testing.assert_array_equal(
        np.asarray(logprobs, dtype=np.float32), np.asarray(doc["rollout_log_probs"], dtype=np.float32)
    )
