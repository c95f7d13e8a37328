"""Reading a training config loads no torch: its settings are plain (`trainer/settings.py`), and
consuming trajectories needs no tensors (`trainer/rollout.py`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_config_and_the_consumer_import_without_torch() -> None:
    code = (
        "import sys, rlgw.trainer.config, rlgw.trainer.consumer\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('rlgw.trainer'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)}
    )
    assert out.returncode == 0, out.stderr
