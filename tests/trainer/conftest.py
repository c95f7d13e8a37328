"""Fixtures the trainer tests share."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def parallel():
    """Megatron's process groups for this module only (other tests may form their own)."""
    yield
    import torch.distributed as dist
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
