"""The PyTorch trainer: a Hugging Face causal LM, AdamW, gradient accumulation over micro-batches.

Runs on CPU with the fixtures and SmolLM2, and on a GPU when `device` says so; one process (data
parallelism over ranks is not written yet). The objective is `rlgw.trainer.objective`'s; this
module owns the model, the optimizer and export.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from rlgw.trainer.batch import MicroBatch, StepBatch
from rlgw.trainer.objective import (
    LossConfig,
    engine_logits,
    merge_metrics,
    micro_batch_loss,
    token_log_probs,
    vocab_columns,
)
from rlgw.trainer.settings import OptimConfig

_ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}


def checkpoint_tensor_names(model_dir: Path) -> dict[str, torch.dtype]:
    """Names and dtypes of the tensors a HF checkpoint stores (tied weights appear once)."""
    names: dict[str, torch.dtype] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as sf:
            for name in sf.keys():
                names[name] = _ST_DTYPES[sf.get_slice(name).get_dtype()]
    if not names:
        raise FileNotFoundError(f"{model_dir} holds no *.safetensors")
    return names


def model_vocab_columns(model_dir: Path, model_vocab: int) -> dict[str, int]:
    """`objective.vocab_columns` of the checkpoint in `model_dir` (`model_vocab`: its config.vocab_size)."""
    from transformers import AutoTokenizer

    return vocab_columns(model_vocab, len(AutoTokenizer.from_pretrained(model_dir)))


class TorchTrainer:
    """`Trainer` over `transformers.AutoModelForCausalLM` (fp32 master weights)."""

    def __init__(
        self,
        model_dir: Path,
        loss: LossConfig,
        optim: OptimConfig,
        *,
        device: str = "cpu",
        seed: int = 0,
    ) -> None:
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        self.model_dir = Path(model_dir)
        self.loss_cfg, self.optim_cfg, self.device = loss, optim, torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).to(self.device)
        self.model.train()
        self._export_dtypes = checkpoint_tensor_names(self.model_dir)
        self.reference = None
        if loss.kl_coef and loss.kl_source == "reference":
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=optim.lr,
            betas=optim.betas,
            eps=optim.eps,
            weight_decay=optim.weight_decay,
        )
        self.pad_id = int(self.model.config.pad_token_id or 0)
        self.vocab_size = int(self.model.config.vocab_size)
        self.vocab_columns = model_vocab_columns(self.model_dir, self.vocab_size)

    def logits(self, mb: MicroBatch, model: torch.nn.Module | None = None) -> Tensor:
        """The micro-batch's logits as the engine saw them (`engine_logits`), [rows, tokens, vocab]."""
        m = model if model is not None else self.model
        out = m(input_ids=mb.input_ids.to(self.device), attention_mask=mb.attention_mask.to(self.device))
        return engine_logits(out.logits, mb.temperature, self.vocab_columns[mb.vocabulary])

    def _aux_log_probs(self, mb: MicroBatch) -> tuple[Tensor | None, Tensor | None]:
        cfg = self.loss_cfg
        old = ref = None
        with torch.no_grad():
            if cfg.old_log_probs == "recompute":
                old = token_log_probs(self.logits(mb, self.model), mb.input_ids.to(self.device))
            if self.reference is not None:
                ref = token_log_probs(self.logits(mb, self.reference), mb.input_ids.to(self.device))
        return old, ref

    def loss_and_backward(self, step: StepBatch) -> dict[str, float]:
        """Accumulate the step's gradients (no optimizer step); returns the step's metrics."""
        parts = []
        tokens = step.rollout_tokens.to(self.device)
        for mb in step.micro_batches:
            mb_dev = to_device(mb, self.device)
            old, ref = self._aux_log_probs(mb_dev)
            loss, metrics = micro_batch_loss(
                self.logits(mb_dev), mb_dev, tokens, self.loss_cfg, old_log_probs=old, ref_log_probs=ref
            )
            loss.backward()
            parts.append(metrics)
        return merge_metrics(parts)

    def train_step(self, step: StepBatch) -> dict[str, float]:
        """Zero grads, accumulate over micro-batches, clip, one AdamW step."""
        self.optimizer.zero_grad(set_to_none=True)
        metrics = self.loss_and_backward(step)
        return optimizer_step(self.model, self.optimizer, self.optim_cfg, metrics, step)

    def export_weights(self) -> Iterator[tuple[str, Tensor]]:
        """The checkpoint's tensors (same names and dtypes as the HF files it was loaded from)."""
        state = self.model.state_dict()
        for name, dtype in self._export_dtypes.items():
            yield name, state[name].detach().to("cpu", dtype)

    def close(self) -> None:
        """Nothing to release: one process."""

    def config_dict(self) -> dict:
        """The model's HF config, for receipts."""
        return json.loads(self.model.config.to_json_string())


def to_device(mb: MicroBatch, device: torch.device) -> MicroBatch:
    """`mb` with every tensor on `device` (itself on the CPU)."""
    if device.type == "cpu":
        return mb
    return MicroBatch(
        input_ids=mb.input_ids.to(device),
        attention_mask=mb.attention_mask.to(device),
        loss_mask=mb.loss_mask.to(device),
        rollout_log_probs=mb.rollout_log_probs.to(device),
        advantages=mb.advantages.to(device),
        rollout_index=mb.rollout_index.to(device),
        temperature=mb.temperature.to(device),
        vocabulary=mb.vocabulary,
        teacher_log_probs=None if mb.teacher_log_probs is None else mb.teacher_log_probs.to(device),
    )


def optimizer_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    cfg: OptimConfig,
    metrics: dict[str, float],
    step: StepBatch,
) -> dict[str, float]:
    """Clip the accumulated gradients, take one optimizer step, and add the step's metrics."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip or float("inf"))
    optimizer.step()
    metrics["grad_norm"] = float(norm)
    metrics["trainable_tokens"] = float(step.trainable_tokens)
    return metrics
