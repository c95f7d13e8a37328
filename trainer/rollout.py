"""One task run as the trainer sees it: its segments' samples, its reward and its group.

Torch-free, so that consuming trajectories (`consumer.py`) and reading a training config load no
torch; batching them into tensors is `batch.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlgw.gateway.sample import Sample


@dataclass(slots=True)
class Rollout:
    """One task run in a step: its segments in order, its reward and its GRPO group."""

    rollout_id: str
    group: int
    reward: float
    segments: list[Sample]
    advantage: float = 0.0

    @property
    def trainable_tokens(self) -> int:
        """Trainable tokens over all segments (the rollout's per-rollout-mean denominator)."""
        return int(sum(int(s.loss_mask.sum()) for s in self.segments))
