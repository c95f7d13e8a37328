"""The Megatron-core trainer: a `GPTModel` built from a Hugging Face config, split over TP x PP x DP ranks
(and EP, expert parallelism, for a MoE model).

Supports the Llama/Qwen family (RMSNorm, SwiGLU, RoPE, grouped-query attention, Qwen3's per-head
q/k norms, tied or untied embeddings) and Qwen3-MoE (megatron-core's MoE layer with HF's routing:
softmax over the experts, top-k, renormalised or not as `norm_topk_prob` says; no load-balancing
loss, no token dropping; experts as a `SequentialMLP`, spread over the expert-parallel ranks; not
yet with tp > 1, see `moe_config`). Each rank builds its piece of the model (its pipeline stage,
its tensor-parallel slice, its experts), loads its shard of the HF weights (`megatron_convert`), and
wraps it in megatron-core's `DistributedDataParallel`; a step runs megatron-core's
forward-backward schedule (1F1B across stages when pp > 1) over the rank's data-parallel share,
`finalize_model_grads` reduces the gradients (summed over replicas: every share's loss is already
weighted by the whole step's denominators), the gradient norm is taken over the whole model, and
each rank's AdamW steps its own parameters. With `distributed_optimizer` the step is
megatron-core's distributed optimizer's instead, the same AdamW with the Adam state sharded over
the replicas: the gradients are reduce-scattered, its `step()` takes the norm over every shard,
clips, updates this replica's shard and all-gathers the parameters (`loss_and_backward` still
all-reduces the whole gradients, for `hf_gradients`). Rank 0 drives (`megatron_ranks`): its `train_step`,
`export_weights` and `hf_gradients` bring the other ranks along, which wait in `follow()`.
On CPU megatron-core needs the shims of `megatron_cpu`. The objective is `rlgw.trainer.objective`'s.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors.torch import load_file
from torch import Tensor

from rlgw.trainer import megatron_ranks as ranks
from rlgw.trainer.batch import MicroBatch, StepBatch
from rlgw.trainer.megatron_convert import (
    SUPPORTED,
    Split,
    check_split,
    hf_to_megatron,
    megatron_to_hf,
    moe_layers,
    num_experts,
    padded_vocab,
    shard,
    unshard,
)
from rlgw.trainer.megatron_cpu import cpu_shims, cuda_is_cpu
from rlgw.trainer.objective import LossConfig, engine_logits, merge_metrics, micro_batch_loss, token_log_probs
from rlgw.trainer.torch_trainer import OptimConfig, checkpoint_tensor_names, model_vocab_columns, to_device


def moe_config(
    hf: dict[str, Any], *, tp: int = 1, ep: int = 1, pp: int = 1, cpu: bool = True
) -> dict[str, Any]:
    """`TransformerConfig` arguments for the HF config's MoE layers (none for a dense model).

    The router is HF Qwen3-MoE's: softmax over the experts, top-k, and with `norm_topk_prob` the
    k weights renormalised to 1, which is megatron-core's softmax over the top-k logits
    (`moe_router_pre_softmax=False`); without it, the softmax over all experts' top-k
    (`pre_softmax=True`). No auxiliary loss and no capacity (no dropped tokens), so the loss is the
    dense objective's; the experts are plain layers (a `SequentialMLP`, no grouped GEMM).
    Tokens reach the experts of other ranks by megatron-core's all-to-all dispatcher on a GPU; on
    a CPU by its all-gather one (the all-to-all one makes a `torch.cuda.Stream` when it is built),
    which refuses variable sequence lengths, so a MoE model on a CPU takes no pipeline (pp = 1).
    Nor does it take tp > 1 (megatron-core 0.16): its MoE layer then trains only with sequence
    parallelism, which the local spec's torch norms refuse (they need Apex or Transformer Engine).
    """
    if not num_experts(hf):
        # (no experts) the config refuses its default dispatcher with variable sequence lengths
        return {"moe_token_dispatcher_type": "alltoall"}
    if tp > 1:
        raise ValueError(
            f"tp={tp} with a MoE model: megatron-core's MoE layer trains under tp > 1 only with sequence "
            "parallelism, which its torch norms refuse (the local spec, without Apex or Transformer Engine); "
            "use ep (and dp) for a MoE model"
        )
    if cpu and pp > 1:
        raise ValueError(
            f"pp={pp} with a MoE model needs a GPU: on a CPU the experts' tokens move by megatron-core's "
            "all-gather dispatcher, which does not take the pipeline's variable sequence lengths"
        )
    return {
        "num_moe_experts": num_experts(hf),
        "moe_router_topk": hf["num_experts_per_tok"],
        "moe_ffn_hidden_size": hf["moe_intermediate_size"],
        "moe_layer_freq": [int(moe) for moe in moe_layers(hf)],
        "moe_router_score_function": "softmax",
        "moe_router_pre_softmax": not hf.get("norm_topk_prob", False),
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        "moe_expert_capacity_factor": None,
        "moe_grouped_gemm": False,
        "moe_token_dispatcher_type": "allgather" if cpu else "alltoall",
        "expert_model_parallel_size": ep,
    }


def transformer_config(hf: dict[str, Any], *, tp: int = 1, pp: int = 1, ep: int = 1, cpu: bool = True) -> Any:
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
        qk_layernorm=hf.get("model_type") in ("qwen3", "qwen3_moe"),
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
        pipeline_dtype=torch.float32,  # what travels between stages
        # micro-batches differ in rows and length: the pipeline sends each one's shape first
        variable_seq_lengths=pp > 1,
        # the objective's micro-batch losses are already the step's shares: the schedule must not
        # divide them by the micro-batch count, nor DDP the gradients by the replica count
        calculate_per_token_loss=True,
        **moe_config(hf, tp=tp, ep=ep, pp=pp, cpu=cpu),
    )


def _rope_theta(hf: dict[str, Any]) -> float:
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    return float(hf.get("rope_theta") or rope.get("rope_theta") or 10000.0)


def build_gpt_model(
    hf: dict[str, Any], split: Split, vocab_rows: int, *, device: str = "cpu"
) -> torch.nn.Module:
    """This rank's (unloaded) piece of a Megatron `GPTModel` with the HF config's architecture."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec

    config = transformer_config(hf, tp=split.tp, pp=split.pp, ep=split.ep, cpu=device == "cpu")
    if config.num_moe_experts:  # MoE and dense layers as `moe_layer_freq` says (local modules, no TE)
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm")
    else:
        spec = get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm, normalization="RMSNorm")
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=vocab_rows,
        max_sequence_length=hf.get("max_position_embeddings", 4096),
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=bool(hf.get("tie_word_embeddings", False)),
        position_embedding_type="rope",
        rotary_base=int(_rope_theta(hf)),
        parallel_output=False,
    ).to(device)


class MegatronTrainer:
    """`Trainer` over megatron-core's `GPTModel`, initialized from a HF checkpoint directory.

    `tp` and `pp` cut the model; the data-parallel size is what the launched world leaves (`dp`,
    when given, is checked against it); `ep` spreads a MoE model's experts over that many of the
    data-parallel ranks (it must divide dp). `vocab_divisible_by` pads the vocabulary as Megatron-LM's
    `--make-vocab-size-divisible-by` does (times tp); those rows past the model's `config.vocab_size`
    are no engine's ids, and the objective drops their logits (`objective.engine_logits`).
    """

    def __init__(self, model_dir: Path, loss: LossConfig, optim: OptimConfig, *, device: str = "cpu",
                 seed: int = 0, tp: int = 1, pp: int = 1, dp: int | None = None, ep: int = 1,
                 vocab_divisible_by: int = 128, distributed_optimizer: bool = False) -> None:  # fmt: skip
        if loss.kl_coef and loss.kl_source == "reference":
            raise NotImplementedError("the Megatron trainer takes KL to a teacher (kl_source='teacher') only")
        torch.manual_seed(seed)
        self.model_dir, self.loss_cfg, self.optim_cfg = Path(model_dir), loss, optim
        self.hf = json.loads((self.model_dir / "config.json").read_text())
        self.split = Split(tp, pp, ep)
        check_split(self.hf, self.split)
        self.device = torch.device(device)
        self.distributed_optimizer = distributed_optimizer
        self._on_device: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext
        if self.device.type == "cpu":
            cpu_shims()
            self._on_device = cuda_is_cpu
        self.layout = ranks.init_parallel(tp, pp, dp, ep=ep)
        self.vocab_columns = model_vocab_columns(self.model_dir, self.hf["vocab_size"])
        self.vocab_rows = padded_vocab(self.hf["vocab_size"], tp, vocab_divisible_by)
        self.model = self._build(device)
        state: dict[str, Tensor] = {}
        for f in sorted(self.model_dir.glob("*.safetensors")):
            state.update(load_file(str(f)))
        self.load_hf_state(state)
        self._export_dtypes = checkpoint_tensor_names(self.model_dir)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer: Any
        if distributed_optimizer:
            self.optimizer = self._megatron_optimizer()
        else:
            self.optimizer = torch.optim.AdamW(
                self.params, lr=optim.lr, betas=optim.betas, eps=optim.eps, weight_decay=optim.weight_decay
            )

    def _megatron_optimizer(self) -> Any:
        """megatron-core's distributed optimizer: Adam state and the update sharded over the replicas.

        The same AdamW as the default path: one lr and weight decay for every parameter (no config
        overrides: Megatron's default marks norms and biases for no decay, which its lr scheduler,
        not used here, would apply), no loss scaling (fp32), clipping by the whole model's norm
        (`clip_grad` 0: none). Its parameter shards are views of the model's (fp32): no copies.
        """
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        opt = self.optim_cfg
        config = OptimizerConfig(
            optimizer="adam", lr=opt.lr, weight_decay=opt.weight_decay, adam_beta1=opt.betas[0],
            adam_beta2=opt.betas[1], adam_eps=opt.eps, clip_grad=opt.grad_clip or 0.0,
            use_distributed_optimizer=True,
        )  # fmt: skip
        with self._on_device():
            return get_megatron_optimizer(config, [self.model], config_overrides={})

    def _build(self, device: str) -> torch.nn.Module:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.distributed.finalize_model_grads import finalize_model_grads

        with self._on_device():
            model = build_gpt_model(self.hf, self.split, self.vocab_rows, device=device)
            ddp = DistributedDataParallel(
                config=model.config,
                ddp_config=DistributedDataParallelConfig(
                    grad_reduce_in_fp32=True,
                    overlap_grad_reduce=False,
                    # grads reduce-scattered, each replica updates its shard, params all-gathered
                    use_distributed_optimizer=self.distributed_optimizer,
                ),
                module=model,
            )

        # called by the schedule after the last backward: DP all-reduce (a sum, see transformer_config;
        # a reduce-scatter with the distributed optimizer unless forced) and the tied embedding's
        # gradient summed over the first and last stage; no token scaling
        def finalize(models: list[Any], *_: Any, force_all_reduce: bool = False, **__: Any) -> None:
            finalize_model_grads(models, force_all_reduce=force_all_reduce)

        model.config.finalize_model_grads_func = finalize
        model.config.no_sync_func = ddp.no_sync
        return ddp

    @property
    def module(self) -> torch.nn.Module:
        """This rank's `GPTModel` piece (inside DDP)."""
        return self.model.module

    def load_hf_state(self, state: dict[str, Tensor]) -> None:
        """Load HF-named weights: this rank's shard of them (every local parameter must be covered)."""
        full = hf_to_megatron(self.hf, state)
        at = self.layout
        local = shard(self.hf, full, self.split, at.tp_rank, at.pp_rank, self.vocab_rows, at.ep_rank)
        converted = {k: v.to(torch.float32) for k, v in local.items()}
        missing, unexpected = self.module.load_state_dict(converted, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        if missing or unexpected:
            raise ValueError(f"HF -> Megatron conversion: missing {missing}, unexpected {unexpected}")

    # -- what every rank runs --------------------------------------------------------------------

    def _schedule(
        self, mbs: list[MicroBatch], loss_func: Callable[..., Any], *, forward_only: bool, whole: bool = True
    ) -> list[Any]:
        """megatron-core's forward-backward over `mbs`; on the last stage, what `loss_func` gave per batch.

        `whole`: the gradients are all-reduced whole on every replica even with the distributed
        optimizer (which, for a step, needs only its shard of them: a reduce-scatter).
        """
        from megatron.core.pipeline_parallel import get_forward_backward_func

        def forward_step(
            data: Iterator[tuple[int, MicroBatch]], model: torch.nn.Module
        ) -> tuple[Tensor, Any]:
            k, mb = next(data)
            ids = mb.input_ids.to(self.device)
            n = ids.shape[1]
            pos = torch.arange(n, device=self.device)[None].expand_as(ids)
            # Megatron's convention: True = masked out. Given explicitly (its default is built on "cuda").
            ones = torch.ones(n, n, dtype=torch.bool, device=self.device)
            causal = torch.triu(ones, diagonal=1)[None, None]
            return model(ids, pos, causal), functools.partial(loss_func, k, mb)

        run = get_forward_backward_func()
        grad = contextlib.nullcontext() if not forward_only else torch.no_grad()
        with self._on_device(), grad:
            return run(
                forward_step_func=forward_step,
                data_iterator=iter(enumerate(mbs)),
                model=[self.model],
                num_microbatches=len(mbs),
                seq_length=max(mb.input_ids.shape[1] for mb in mbs),
                micro_batch_size=max(mb.rows for mb in mbs),
                forward_only=forward_only,
                force_all_reduce=whole,
            )

    def _old_log_probs(self, mbs: list[MicroBatch]) -> list[Tensor] | None:
        if self.loss_cfg.old_log_probs != "recompute":
            return None

        def logprobs(k: int, mb: MicroBatch, output: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
            logits = engine_logits(output, mb.temperature.to(self.device), self.vocab_columns[mb.vocabulary])
            old = token_log_probs(logits, mb.input_ids.to(self.device)).detach()
            return output.new_zeros(()), torch.ones((), dtype=torch.int), {"old": old}

        return [d["old"] for d in self._schedule(mbs, logprobs, forward_only=True)]

    def _backward_local(self, share: StepBatch, *, whole: bool = True) -> dict[str, float]:
        """Gradients of this rank's share, reduced over the model and the replicas; the step's metrics.

        `whole` False: with the distributed optimizer each replica gets only its shard reduced.
        """
        self.model.zero_grad_buffer()
        tokens = share.rollout_tokens.to(self.device)
        old = self._old_log_probs(share.micro_batches)

        def loss(k: int, mb: MicroBatch, output: Tensor) -> tuple[Tensor, Tensor, dict[str, float]]:
            logits = engine_logits(output, mb.temperature.to(self.device), self.vocab_columns[mb.vocabulary])
            mb = to_device(mb, self.device)
            value, metrics = micro_batch_loss(
                logits, mb, tokens, self.loss_cfg, old_log_probs=None if old is None else old[k]
            )
            return value, torch.ones((), dtype=torch.int), metrics

        parts = self._schedule(share.micro_batches, loss, forward_only=False, whole=whole)
        # every tensor-parallel rank of the last stage computed the same loss: count one of them
        mine = merge_metrics(parts) if self.layout.last_stage and self.layout.tp_rank == 0 else {}
        metrics = merge_metrics([m for m in ranks.all_gather(self.layout, mine) if m])
        metrics["trainable_tokens"] = float(share.rollout_tokens.sum())
        return metrics

    def _grad_norm(self) -> Tensor:
        """The L2 norm of the whole model's gradient: each tensor-parallel slice once, replicas once."""
        from megatron.core import parallel_state

        tied_copy = None
        if self.split.pp > 1 and self.layout.last_stage and self.hf.get("tie_word_embeddings", False):
            tied_copy = self.module.output_layer.weight  # the first stage counts the embedding
        counted = [
            p for p in self.params
            if p is not tied_copy and (self.layout.tp_rank == 0 or getattr(p, "tensor_model_parallel", False))
        ]  # fmt: skip
        # expert-parallel experts (megatron-core's `allreduce=False`) differ across the ep ranks too
        sq = [torch.zeros((), dtype=torch.float64, device=self.device) for _ in range(2)]  # the rest, experts
        for p in counted:
            sq[int(not getattr(p, "allreduce", True))] += p.main_grad.double().pow(2).sum()
        if self.layout.world > 1:
            torch.distributed.all_reduce(sq[0], group=parallel_state.get_model_parallel_group())
            experts = parallel_state.get_expert_tensor_model_pipeline_parallel_group()
            torch.distributed.all_reduce(sq[1], group=experts)
        return (sq[0] + sq[1]).sqrt().float()

    def _step_local(self, share: StepBatch) -> dict[str, float]:
        """Gradients, clip by the whole model's norm (as `clip_grad_norm_`), one AdamW step."""
        metrics = self._backward_local(share, whole=False)
        metrics["grad_norm"] = self._distributed_step() if self.distributed_optimizer else self._adamw_step()
        return metrics

    def _adamw_step(self) -> float:
        """Clip by the whole model's norm, step this rank's AdamW over its whole parameters; the norm."""
        norm = self._grad_norm()
        coef = ((self.optim_cfg.grad_clip or float("inf")) / (norm + 1e-6)).clamp(max=1.0)
        for p in self.params:
            p.grad = p.main_grad.mul_(coef)
        self.optimizer.step()
        for p in self.params:  # DDP's hooks add each backward's .grad into main_grad: start from None
            p.grad = None
        return float(norm)

    def _distributed_step(self) -> float:
        """megatron-core's step: the norm over all shards, clip, Adam on this shard, all-gather; the norm."""
        with self._on_device():
            ok, norm, _ = self.optimizer.step()
        if not ok:  # only a loss scaler skips a step, and fp32 has none
            raise RuntimeError("megatron-core's distributed optimizer skipped the step")
        self.optimizer.zero_grad()  # drops the shards' .grad (views of the gradient buffer)
        return float(norm)

    def _local_pieces(
        self, source: Callable[[], dict[str, Tensor]]
    ) -> dict[tuple[int, int, int], dict[str, Tensor]] | None:
        # gather_to_driver copies: what is published must not change when the next step updates it
        local = {k: v for k, v in source().items() if not k.endswith("_extra_state")}
        return ranks.gather_to_driver(self.layout, local)

    def _weights(self) -> dict[tuple[int, int, int], dict[str, Tensor]] | None:
        return self._local_pieces(self.module.state_dict)

    def _grads(self) -> dict[tuple[int, int, int], dict[str, Tensor]] | None:
        return self._local_pieces(lambda: {k: p.main_grad for k, p in self.module.named_parameters()})

    _COMMANDS: ClassVar[dict[str, str]] = {
        "backward": "_backward_local",
        "step": "_step_local",
        "weights": "_weights",
        "grads": "_grads",
    }

    def _collective(self, name: str, step: StepBatch | None = None) -> Any:
        """Run command `name` on every rank (rank 0 announces it and scatters `step` when it has one)."""
        ranks.command(self.layout, name)
        if name in ("backward", "step"):
            return getattr(self, self._COMMANDS[name])(ranks.scatter_step(self.layout, step))
        return getattr(self, self._COMMANDS[name])()

    def follow(self) -> None:
        """On ranks other than 0: do what rank 0 says, until it says stop (its `close`)."""
        if self.layout.driver:
            raise RuntimeError("rank 0 drives; follow() is for the other ranks")
        while (name := ranks.command(self.layout)) != "stop":
            if name in ("backward", "step"):
                getattr(self, self._COMMANDS[name])(ranks.scatter_step(self.layout, None))
            else:
                getattr(self, self._COMMANDS[name])()

    # -- rank 0's interface (the `Trainer` protocol) ---------------------------------------------

    def loss_and_backward(self, step: StepBatch) -> dict[str, float]:
        """Accumulate the step's gradients over its micro-batches (all ranks); returns the metrics."""
        return self._collective("backward", step)

    def train_step(self, step: StepBatch) -> dict[str, float]:
        """One optimizer step over `step`, its micro-batches scattered over the data-parallel replicas."""
        return self._collective("step", step)

    def hf_gradients(self) -> dict[str, Tensor]:
        """The current (reduced) gradients under HF names, gathered whole (for comparing with one rank)."""
        return megatron_to_hf(self.hf, unshard(self.hf, self._collective("grads"), self.split))

    def export_weights(self) -> Iterator[tuple[str, Tensor]]:
        """The weights under the HF checkpoint's names and dtypes, gathered whole from every rank."""
        hf = megatron_to_hf(self.hf, unshard(self.hf, self._collective("weights"), self.split))
        return ((name, hf[name].to(dtype).contiguous()) for name, dtype in self._export_dtypes.items())

    def close(self) -> None:
        """Release the other ranks from `follow()` (rank 0, once, at the end of the run)."""
        if self.layout.driver:
            ranks.command(self.layout, "stop")
