"""Routing replay (R3) on a MoE with small router margins, and what recording routing costs.

Part 1: `near_tie_qwen3_moe` (tests/trainer/support.py) at three tie widths, and the learning run's
`upcycled_tiny_moe` (tests/trainer/test_moe_learning_run.py): the embedded engine
samples rollouts (temperature 1, their routed experts recorded), and the PyTorch trainer computes
the same tokens' logprobs with and without `routing_replay`. Printed per tie: the largest and mean
|trainer - engine| logprob over the generated tokens, and the share of generated tokens whose
experts differ from the engine's in some layer. Reference: replay's gap is rounding (about 1e-5).

Part 2: storage per token of `rollout_routed_experts` (uint8 [layers, top_k] per token) in the
ledger, the journal row (base64), the store's zstd blob (measured against the same sample without
routing) and the JSON API, for the tiny model and a Qwen3-30B-A3B-shaped routing (48 layers, top-8
of 128 experts) with random ids (a worst case for compression: real routing repeats more).

Part 3: the embedded engine's time with routing capture on against off (reference ratio: 1.0).

Run: OMP_NUM_THREADS=1 PYTHONPATH=. python -m bench.moe_replay
"""

from __future__ import annotations

import base64
import dataclasses
import tempfile
from pathlib import Path

import numpy as np
import orjson

from rlgw.gateway.sample import Sample, compact_routing
from rlgw.gateway.trajectories.store import encode_arrays
from rlgw.trainer.objective import LossConfig
from rlgw.trainer.settings import OptimConfig
from rlgw.trainer.torch_trainer import TorchTrainer
from tests.support.moe_replay import engine_samples, trainer_gap
from tests.trainer.support import near_tie_qwen3_moe, upcycled_tiny_moe

TIES = (1e-5, 1e-6, 1e-7)


def replay_table(tmp: Path) -> None:
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, 4000, 16).tolist() for _ in range(8)]
    print("routing replay, PyTorch trainer vs embedded engine (8 prompts x 32 sampled tokens, both fp32)")
    print(f"{'model, tie':>15} {'replay':>6} {'max gap':>10} {'mean gap':>10} {'mismatch':>10}")
    models = [(f"near-tie {tie:.0e}", near_tie_qwen3_moe(tmp / f"tie-{tie}", tie=tie)) for tie in TIES]
    models.append(("upcycled 1e-07", upcycled_tiny_moe(tmp / "upcycled")))
    for label, model in models:
        samples = engine_samples(model, prompts, max_new_tokens=32)
        for replay in (False, True):
            t = TorchTrainer(model, LossConfig(), OptimConfig(), routing_replay=replay)
            print(f"{label:>15} {'on' if replay else 'off':>6} {trainer_gap(t, samples).row()}")
    print("reference: replay on keeps the gap at fp32 rounding (about 1e-5) and the mismatch at 0%")


def storage(sample: Sample, label: str) -> None:
    routed = sample.rollout_routed_experts
    n = len(sample.tokens)
    bare = dataclasses.replace(sample, rollout_routed_experts=None)
    ledger = routed.nbytes / n
    journal = len(base64.b64encode(routed.tobytes())) / n
    store = (len(encode_arrays(sample)) - len(encode_arrays(bare))) / n
    api = (len(orjson.dumps(sample.to_dict(numpy=True), option=orjson.OPT_SERIALIZE_NUMPY))
           - len(orjson.dumps(bare.to_dict(numpy=True), option=orjson.OPT_SERIALIZE_NUMPY))) / n  # fmt: skip
    tokens = len(orjson.dumps(sample.tokens, option=orjson.OPT_SERIALIZE_NUMPY)) / n
    row = f"{label:<34} {ledger:8.1f} {journal:8.1f} {store:8.1f} {api:8.1f}"
    print(f"{row}   (token ids in JSON: {tokens:.1f})")


def storage_table(tmp: Path) -> None:
    print("\nbytes per token of rollout_routed_experts")
    print(f"{'routing':<34} {'ledger':>8} {'journal':>8} {'store':>8} {'api json':>8}")
    model = near_tie_qwen3_moe(tmp / "storage", tie=1e-6)
    rng = np.random.default_rng(0)
    (sample,) = engine_samples(model, [rng.integers(10, 4000, 64).tolist()], max_new_tokens=192)
    storage(sample, "tiny (2 layers, top-3 of 8), engine")
    n = 4096
    ids = np.stack([rng.choice(128, 8, replace=False) for _ in range(n * 48)]).reshape(n, 48, 8)
    big = dataclasses.replace(
        sample,
        tokens=rng.integers(0, 151000, n + 1).astype(np.int32),
        response_length=len(sample.loss_mask),
        rollout_routed_experts=compact_routing(ids),
    )
    storage(big, "48 layers, top-8 of 128, random")


def capture_cost(tmp: Path) -> None:
    """Embedded engine: 8 concurrent 128-token generations from fresh 64-token prompts (no prefix-cache
    hit either way: a position whose routing is asked for is always computed), routing asked or not."""
    import asyncio
    import itertools
    import time

    from rlgw.engine.core import Engine, EngineConfig
    from tests.engine.conftest import run_requests

    model = near_tie_qwen3_moe(tmp / "capture", tie=1e-6)
    engine = Engine(model, EngineConfig(max_queue=64, max_running=8))
    params = [{"max_new_tokens": 128, "temperature": 1.0, "ignore_eos": True}]
    fresh = itertools.count(10)

    async def batch(routed: bool) -> None:
        prompts = [[next(fresh) % 4000 for _ in range(64)] for _ in range(8)]
        fields = {"return_logprob": True, "return_routed_experts": routed}
        await asyncio.gather(*(run_requests(engine, p, params, **fields) for p in prompts))

    def timed(routed: bool) -> float:
        start = time.perf_counter()
        asyncio.run(batch(routed))
        return time.perf_counter() - start

    try:
        runs = [(timed(False), timed(True)) for _ in range(5)]  # interleaved: the machine's load shifts
    finally:
        engine.shutdown()
    off, on = min(r[0] for r in runs), min(r[1] for r in runs)
    print(f"\nengine, 8 x 128 tokens: {off:.3f} s without routing, {on:.3f} s with it ({on / off:.2f}x)")


def main() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        replay_table(Path(tmp))
        storage_table(Path(tmp))
        capture_cost(Path(tmp))


if __name__ == "__main__":
    main()
