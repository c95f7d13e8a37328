"""The one interface every trainer backend implements (PyTorch, Megatron-core)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from torch import Tensor

from rlgw.trainer.batch import StepBatch


class Trainer(Protocol):
    """Train on a step's batch; export the weights (Hugging Face names and shapes) for sync.

    Not a vehicle for code reuse: the shared math lives in `rlgw.trainer.objective`.
    """

    def train_step(self, step: StepBatch) -> dict[str, float]:
        """One optimizer step over every micro-batch of `step`; returns the step's metrics."""
        ...

    def export_weights(self) -> Iterator[tuple[str, Tensor]]:
        """The current weights as (HF parameter name, CPU tensor), in the checkpoint's dtype."""
        ...

    def close(self) -> None:
        """End of the run: release what the trainer holds beyond this process (other ranks)."""
        ...
