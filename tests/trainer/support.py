"""What the trainer tests share: sample metadata as the gateway records it, TensorBoard reading, and
running `rlgw train` as a user does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.procs import REPO


def sampled_at(temperature: float = 1.0) -> dict[str, Any]:
    """Sample metadata saying its one turn was sampled at `temperature` (as the gateway records it)."""
    return {"turn_temperature": [{"turn": 0, "temperature": temperature}]}


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in the TensorBoard event files under `log_dir`, read with tensorboard's reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def run_train(config: Path, work: Path, *extra: str, timeout: float = 1200) -> list[dict[str, Any]]:
    """Run `rlgw train --config config --work-dir work *extra` in a subprocess; its receipts, in order."""
    proc = subprocess.run(
        [sys.executable, "-m", "rlgw.bin.main", "--log-level", "warning", "train", "--config", str(config),
         "--work-dir", str(work), "--no-progress", *extra],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(line) for line in (work / "receipts.jsonl").read_text().splitlines()]
