"""`rlgw trajectories export` on first use (issue 13): stdout by default, and parquet without pyarrow
answers with the extra to install instead of a traceback (the import failure is simulated by a
`pyarrow` package on PYTHONPATH that raises ImportError, as a missing install would)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest

from rlgw.gateway.trajectories.store import TrajectoryStore
from tests.support.sample_factory import make_sample


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("export-data")
    rng = np.random.default_rng(3)

    async def fill() -> None:
        store = TrajectoryStore.open(data)
        await store.add_samples("alice", "s-1", "task-1", [make_sample(rng), make_sample(rng, response=20)])
        await store.close()

    asyncio.run(fill())
    return data


def _export(data: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlgw.bin.main", "trajectories", "export", "--data-dir", str(data), *args],
        capture_output=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def test_jsonl_export_goes_to_stdout_without_out(store_dir: Path) -> None:
    out = _export(store_dir, "--format", "jsonl")
    assert out.returncode == 0, out.stderr
    docs = [orjson.loads(line) for line in out.stdout.splitlines()]
    assert [(d["session_id"], d["segment"]) for d in docs] == [("s-1", 0), ("s-1", 1)]


def test_parquet_without_pyarrow_names_the_extra(store_dir: Path, tmp_path: Path) -> None:
    fake = tmp_path / "no-pyarrow" / "pyarrow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named pyarrow')\n")
    path = os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")])
    target = tmp_path / "out.parquet"
    out = _export(store_dir, "--format", "parquet", "--out", str(target), env={"PYTHONPATH": path})
    err = out.stderr.decode()
    assert out.returncode == 2
    assert "Traceback" not in err and "`parquet`" in err and "pip install" in err
    assert not target.exists()
