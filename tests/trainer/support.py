"""What the trainer tests' hand-made samples share with the gateway's."""

from __future__ import annotations

from typing import Any


def sampled_at(temperature: float = 1.0) -> dict[str, Any]:
    """Sample metadata saying its one turn was sampled at `temperature` (as the gateway records it)."""
    return {"turn_temperature": [{"turn": 0, "temperature": temperature}]}
