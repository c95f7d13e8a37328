"""What the trainer tests share: sample metadata as the gateway records it, TensorBoard reading, and
running `rlgw train` as a user does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from rlgw.gateway.engine_semantics import embedded_semantics
from tests.support.procs import REPO


def sampled_at(temperature: float = 1.0) -> dict[str, Any]:
    """Sample metadata saying its one turn was sampled at `temperature` by the embedded engine (as the
    gateway records it)."""
    return {
        "turn_temperature": [{"turn": 0, "temperature": temperature}],
        "engine": embedded_semantics("test").to_metadata(),
    }


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


def tiny_qwen3_moe(out: Path, *, seed: int = 0, mlp_only_layers: tuple[int, ...] = ()) -> Path:
    """A random-init Qwen3-MoE under `out` (4 experts, top-2, hidden 64, 2 layers; tiny-qwen3's
    tokenizer), saved as safetensors with `save_pretrained`. The router is scaled up (x20) so that
    each token's top-2 experts win by clear margins: a 1e-6 difference in the hidden states between
    two implementations must not change which experts a token goes to."""
    import shutil

    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from tests.support.procs import FIXTURES

    torch.manual_seed(seed)
    config = Qwen3MoeConfig(
        vocab_size=4096, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
        norm_topk_prob=True, mlp_only_layers=list(mlp_only_layers), tie_word_embeddings=True,
        max_position_embeddings=8192, rope_parameters={"rope_theta": 1e6, "rope_type": "default"},
        bos_token_id=4000, eos_token_id=4002, pad_token_id=4000,
    )  # fmt: skip
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.weight.mul_(20)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES / "tiny-qwen3" / name, out / name)
    return out
