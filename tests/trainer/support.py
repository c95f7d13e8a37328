"""What the trainer tests' hand-made samples share with the gateway's."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def sampled_at(temperature: float = 1.0) -> dict[str, Any]:
    """Sample metadata saying its one turn was sampled at `temperature` (as the gateway records it)."""
    return {"turn_temperature": [{"turn": 0, "temperature": temperature}]}


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in the TensorBoard event files under `log_dir`, read with tensorboard's reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
