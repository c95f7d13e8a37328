"""The Megatron-core trainer: a `GPTModel` built from a Hugging Face config, HF weights converted in and out.

Supports the Llama/Qwen family (RMSNorm, SwiGLU, RoPE, grouped-query attention, Qwen3's per-head
q/k norms, tied or untied embeddings). Tensor- and pipeline-parallel sizes go to
`parallel_state.initialize_model_parallel` and the `TransformerConfig` as given; the HF weight
conversion here is for unsharded weights (tp = pp = 1), and larger sizes are refused until sharded
conversion exists. Under `torchrun` it joins the process group torchrun describes, alone it forms
a one-process gloo group; data-parallel gradient reduction across ranks is not written yet.

On CPU megatron-core needs shims (see FACTS.md): a no-op RNG-tracker fork, its global memory
buffer allocating on the CPU instead of `torch.cuda.current_device()`, and (0.16) RoPE's
`get_emb`, which moves its frequencies to `torch.cuda.current_device()`. `cpu_shims()` applies
them; on a GPU none is applied. The objective is `rlgw.trainer.objective`'s.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch import Tensor

from rlgw.trainer.batch import MicroBatch, StepBatch
from rlgw.trainer.objective import LossConfig, engine_logits, merge_metrics, micro_batch_loss, token_log_probs
from rlgw.trainer.torch_trainer import OptimConfig, checkpoint_tensor_names, optimizer_step, sampled_vocab

SUPPORTED = {"qwen3", "qwen2", "llama", "mistral"}


def cpu_shims() -> None:
    """Let megatron-core run forward and backward on a CPU (idempotent)."""
    from megatron.core import utils
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    if getattr(utils.GlobalMemoryBuffer.get_tensor, "_rlgw_cpu", False):
        return

    def get_tensor(
        self: Any, tensor_shape: Any, dtype: torch.dtype, name: str, mem_alloc_context: Any = None
    ) -> Tensor:
        n = 1
        for d in tensor_shape:
            n *= d
        key = (name, dtype)
        if key not in self.buffer or self.buffer[key].numel() < n:
            self.buffer[key] = torch.empty(n, dtype=dtype, device="cpu", requires_grad=False)
        return self.buffer[key][:n].view(*tensor_shape)

    get_tensor._rlgw_cpu = True  # type: ignore[attr-defined]
    utils.GlobalMemoryBuffer.get_tensor = get_tensor

    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    original = RotaryEmbedding.get_emb

    def get_emb(self: Any, *args: Any, **kwargs: Any) -> Tensor:
        # get_emb moves inv_freq to torch.cuda.current_device() when it is on the CPU; here the
        # CPU is the device, so for this call "the current CUDA device" is the CPU.
        current = torch.cuda.current_device
        torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
        try:
            return original(self, *args, **kwargs)
        finally:
            torch.cuda.current_device = current

    RotaryEmbedding.get_emb = get_emb


def init_parallel(tp: int = 1, pp: int = 1, backend: str | None = None) -> None:
    """Join (or create) the process group and Megatron's model-parallel groups."""
    from megatron.core import parallel_state

    if not dist.is_initialized():
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if "RANK" in os.environ:  # under torchrun: the group it describes
            dist.init_process_group(backend)
        else:  # run alone: a one-process group, without touching the environment
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp
        )


def transformer_config(hf: dict[str, Any], *, tp: int = 1, pp: int = 1, cpu: bool = True) -> Any:
    """A `TransformerConfig` equal to the HF config's architecture."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    if hf.get("model_type") not in SUPPORTED:
        raise ValueError(f"model_type {hf.get('model_type')!r} is not one of {sorted(SUPPORTED)}")
    heads = hf["num_attention_heads"]
    return TransformerConfig(
        num_layers=hf["num_hidden_layers"],
        hidden_size=hf["hidden_size"],
        ffn_hidden_size=hf["intermediate_size"],
        num_attention_heads=heads,
        num_query_groups=hf.get("num_key_value_heads", heads),
        kv_channels=hf.get("head_dim") or hf["hidden_size"] // heads,
        normalization="RMSNorm",
        layernorm_epsilon=hf.get("rms_norm_eps", 1e-6),
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=bool(hf.get("attention_bias", hf.get("model_type") == "qwen2")),
        qk_layernorm=hf.get("model_type") == "qwen3",
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        use_cpu_initialization=cpu,
        params_dtype=torch.float32,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
    )


def _rope_theta(hf: dict[str, Any]) -> float:
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    return float(hf.get("rope_theta") or rope.get("rope_theta") or 10000.0)


def hf_to_megatron(hf: dict[str, Any], state: dict[str, Tensor]) -> dict[str, Tensor]:
    """HF Llama/Qwen weights as an unsharded Megatron `GPTModel` state dict (local layer spec)."""
    heads, groups = hf["num_attention_heads"], hf.get("num_key_value_heads", hf["num_attention_heads"])
    d = hf.get("head_dim") or hf["hidden_size"] // heads
    per = heads // groups
    out = {"embedding.word_embeddings.weight": state["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": state["model.norm.weight"]}  # fmt: skip
    if not hf.get("tie_word_embeddings", False):
        out["output_layer.weight"] = state["lm_head.weight"]
    for i in range(hf["num_hidden_layers"]):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        q = state[h + "self_attn.q_proj.weight"].view(groups, per * d, -1)
        k = state[h + "self_attn.k_proj.weight"].view(groups, d, -1)
        v = state[h + "self_attn.v_proj.weight"].view(groups, d, -1)
        # Megatron keeps q, k and v of each query group together: [g0: q.. k v, g1: q.. k v, ...]
        out[m + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], 1).reshape(-1, q.shape[-1])
        if h + "self_attn.q_proj.bias" in state:
            qb = state[h + "self_attn.q_proj.bias"].view(groups, per * d)
            kb = state[h + "self_attn.k_proj.bias"].view(groups, d)
            vb = state[h + "self_attn.v_proj.bias"].view(groups, d)
            out[m + "self_attention.linear_qkv.bias"] = torch.cat([qb, kb, vb], 1).reshape(-1)
        out[m + "input_layernorm.weight"] = state[h + "input_layernorm.weight"]
        out[m + "self_attention.linear_proj.weight"] = state[h + "self_attn.o_proj.weight"]
        if h + "self_attn.q_norm.weight" in state:
            out[m + "self_attention.q_layernorm.weight"] = state[h + "self_attn.q_norm.weight"]
            out[m + "self_attention.k_layernorm.weight"] = state[h + "self_attn.k_norm.weight"]
        out[m + "pre_mlp_layernorm.weight"] = state[h + "post_attention_layernorm.weight"]
        out[m + "mlp.linear_fc1.weight"] = torch.cat(
            [state[h + "mlp.gate_proj.weight"], state[h + "mlp.up_proj.weight"]], 0
        )
        out[m + "mlp.linear_fc2.weight"] = state[h + "mlp.down_proj.weight"]
    return out


def megatron_to_hf(hf: dict[str, Any], state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The inverse of `hf_to_megatron` (HF names and shapes, for weight sync)."""
    heads, groups = hf["num_attention_heads"], hf.get("num_key_value_heads", hf["num_attention_heads"])
    d = hf.get("head_dim") or hf["hidden_size"] // heads
    per = heads // groups
    out = {"model.embed_tokens.weight": state["embedding.word_embeddings.weight"],
           "model.norm.weight": state["decoder.final_layernorm.weight"]}  # fmt: skip
    if "output_layer.weight" in state and not hf.get("tie_word_embeddings", False):
        out["lm_head.weight"] = state["output_layer.weight"]
    for i in range(hf["num_hidden_layers"]):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        qkv = state[m + "self_attention.linear_qkv.weight"].view(groups, (per + 2) * d, -1)
        out[h + "self_attn.q_proj.weight"] = qkv[:, : per * d].reshape(-1, qkv.shape[-1])
        out[h + "self_attn.k_proj.weight"] = qkv[:, per * d : (per + 1) * d].reshape(-1, qkv.shape[-1])
        out[h + "self_attn.v_proj.weight"] = qkv[:, (per + 1) * d :].reshape(-1, qkv.shape[-1])
        if m + "self_attention.linear_qkv.bias" in state:
            b = state[m + "self_attention.linear_qkv.bias"].view(groups, (per + 2) * d)
            out[h + "self_attn.q_proj.bias"] = b[:, : per * d].reshape(-1)
            out[h + "self_attn.k_proj.bias"] = b[:, per * d : (per + 1) * d].reshape(-1)
            out[h + "self_attn.v_proj.bias"] = b[:, (per + 1) * d :].reshape(-1)
        out[h + "input_layernorm.weight"] = state[m + "input_layernorm.weight"]
        out[h + "self_attn.o_proj.weight"] = state[m + "self_attention.linear_proj.weight"]
        if m + "self_attention.q_layernorm.weight" in state:
            out[h + "self_attn.q_norm.weight"] = state[m + "self_attention.q_layernorm.weight"]
            out[h + "self_attn.k_norm.weight"] = state[m + "self_attention.k_layernorm.weight"]
        out[h + "post_attention_layernorm.weight"] = state[m + "pre_mlp_layernorm.weight"]
        gate, up = state[m + "mlp.linear_fc1.weight"].chunk(2, 0)
        out[h + "mlp.gate_proj.weight"], out[h + "mlp.up_proj.weight"] = gate, up
        out[h + "mlp.down_proj.weight"] = state[m + "mlp.linear_fc2.weight"]
    return out


def build_gpt_model(hf: dict[str, Any], *, tp: int = 1, pp: int = 1, device: str = "cpu") -> torch.nn.Module:
    """An (unloaded) Megatron `GPTModel` with the HF config's architecture."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    cpu = device == "cpu"
    config = transformer_config(hf, tp=tp, pp=pp, cpu=cpu)
    spec = get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm, normalization="RMSNorm")
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=hf["vocab_size"],
        max_sequence_length=hf.get("max_position_embeddings", 4096),
        share_embeddings_and_output_weights=bool(hf.get("tie_word_embeddings", False)),
        position_embedding_type="rope",
        rotary_base=int(_rope_theta(hf)),
        parallel_output=False,
    ).to(device)


class MegatronTrainer:
    """`Trainer` over megatron-core's `GPTModel`, initialized from a HF checkpoint directory."""

    def __init__(self, model_dir: Path, loss: LossConfig, optim: OptimConfig, *, device: str = "cpu",
                 seed: int = 0, tp: int = 1, pp: int = 1) -> None:  # fmt: skip
        if tp != 1 or pp != 1:
            raise NotImplementedError(
                "HF weight conversion for sharded (tp > 1 or pp > 1) models is not written yet"
            )
        if loss.kl_coef and loss.kl_source == "reference":
            raise NotImplementedError("the Megatron trainer takes KL to a teacher (kl_source='teacher') only")
        torch.manual_seed(seed)
        self.model_dir, self.loss_cfg, self.optim_cfg = Path(model_dir), loss, optim
        self.device = torch.device(device)
        if self.device.type == "cpu":
            cpu_shims()
        init_parallel(tp, pp)
        self.hf = json.loads((self.model_dir / "config.json").read_text())
        self.sampled_vocab = sampled_vocab(self.model_dir, self.hf["vocab_size"])
        self.model = build_gpt_model(self.hf, tp=tp, pp=pp, device=device)
        state: dict[str, Tensor] = {}
        for f in sorted(self.model_dir.glob("*.safetensors")):
            state.update(load_file(str(f)))
        self.load_hf_state(state)
        self._export_dtypes = checkpoint_tensor_names(self.model_dir)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=optim.lr,
            betas=optim.betas,
            eps=optim.eps,
            weight_decay=optim.weight_decay,
        )

    def load_hf_state(self, state: dict[str, Tensor]) -> None:
        """Load HF-named weights (converted; every Megatron parameter must be covered)."""
        converted = {k: v.to(torch.float32) for k, v in hf_to_megatron(self.hf, state).items()}
        missing, unexpected = self.model.load_state_dict(converted, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        if missing or unexpected:
            raise ValueError(f"HF -> Megatron conversion: missing {missing}, unexpected {unexpected}")

    def logits(self, mb: MicroBatch) -> Tensor:
        """[rows, tokens, vocab] logits of the micro-batch as the engine saw them (`engine_logits`).

        Causal attention; right padding is inert.
        """
        ids = mb.input_ids.to(self.device)
        n = ids.shape[1]
        pos = torch.arange(n, device=self.device)[None].expand_as(ids)
        # Megatron's convention: True = masked out. Given explicitly (its default mask is built on "cuda").
        causal = torch.triu(torch.ones(n, n, dtype=torch.bool, device=self.device), diagonal=1)[None, None]
        return engine_logits(self.model(ids, pos, causal), mb.temperature, self.sampled_vocab)

    def loss_and_backward(self, step: StepBatch) -> dict[str, float]:
        """Accumulate the step's gradients over its micro-batches; returns the metrics."""
        old = None
        parts = []
        tokens = step.rollout_tokens.to(self.device)
        for mb in step.micro_batches:
            if self.loss_cfg.old_log_probs == "recompute":
                with torch.no_grad():
                    old = token_log_probs(self.logits(mb), mb.input_ids.to(self.device))
            loss, metrics = micro_batch_loss(self.logits(mb), mb, tokens, self.loss_cfg, old_log_probs=old)
            loss.backward()
            parts.append(metrics)
        return merge_metrics(parts)

    def train_step(self, step: StepBatch) -> dict[str, float]:
        """Zero grads, accumulate, clip, one AdamW step."""
        self.optimizer.zero_grad(set_to_none=True)
        metrics = self.loss_and_backward(step)
        return optimizer_step(self.model, self.optimizer, self.optim_cfg, metrics, step)

    def hf_gradients(self) -> dict[str, Tensor]:
        """The current gradients under HF names (for comparing with the PyTorch trainer)."""
        grads = {k: p.grad for k, p in self.model.named_parameters() if p.grad is not None}
        return megatron_to_hf(self.hf, grads)

    def export_weights(self) -> Iterator[tuple[str, Tensor]]:
        """The weights under the HF checkpoint's names and dtypes."""
        state = {k: v for k, v in self.model.state_dict().items() if not k.endswith("_extra_state")}
        hf = megatron_to_hf(self.hf, state)
        for name, dtype in self._export_dtypes.items():
            yield name, hf[name].detach().to("cpu", dtype).contiguous()
