"""`rlgw train`'s configuration file (JSON or TOML), validated once at the edge with pydantic.

Builders turn it into the plain arguments each component takes (`LossConfig`, `OptimConfig`,
`AcceptancePolicy`, a rollout source), so no component sees this object.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlgw.trainer.consumer import AcceptancePolicy, Action
from rlgw.trainer.rollouts import ChatRollouts, RolloutSource, ScaffoldRollouts, WordTask
from rlgw.trainer.settings import LossConfig, OptimConfig, Reduction
from rlgw.trainer.tool_task import ToolRollouts
from rlgw.trainer.tracking import Trackers, WandbSettings


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChatRolloutsSpec(_Strict):
    """One-turn chats with a verifiable first word."""

    kind: Literal["chat"] = Field("chat", description="This rollout source.")
    tasks: list[dict[str, str]] = Field(
        min_length=1,
        description='The prompts: `{"prompt": ..., "word": ...}`; a reply starting with `word` pays 1.',
    )
    groups: int = Field(4, ge=1, description="GRPO groups per iteration (each one prompt).")
    group_size: int = Field(8, ge=2, description="Attempts per group (they share one `group_index`).")
    max_tokens: int = Field(8, ge=1, description="Cap on each reply's sampled tokens.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of every attempt.")
    concurrency: int = Field(16, ge=1, description="Sessions run at once.")


class ToolRolloutsSpec(_Strict):
    """The built-in two-turn tool task (`rlgw.trainer.tool_task`): call `locate`, answer with its city."""

    kind: Literal["tool"] = Field(description="This rollout source.")
    groups: int = Field(4, ge=1, description="GRPO groups per iteration (each one city).")
    group_size: int = Field(8, ge=2, description="Attempts per group (they share one `group_index`).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of every attempt.")
    concurrency: int = Field(16, ge=1, description="Sessions run at once.")


class ScaffoldRolloutsSpec(_Strict):
    """Installed scaffolds on a tasks file (see `rlgw run`)."""

    kind: Literal["scaffold"] = Field(description="This rollout source.")
    scaffold: str = Field(
        description="The agent: `rlgw-mini`, `openhands`, `terminus-2`, or a coding-agent CLI."
    )
    tasks_file: str = Field(description="JSONL tasks file, as `rlgw run --tasks` reads.")
    groups: int = Field(2, ge=1, description="GRPO groups per iteration (each one task).")
    group_size: int = Field(4, ge=2, description="Attempts per task (they share one `group_index`).")
    max_turns: int = Field(4, ge=1, description="The agent's turn limit, where it has one.")
    concurrency: int = Field(4, ge=1, description="Task runs at once.")
    scaffold_options: dict[str, Any] = Field(
        default_factory=dict, description="The scaffold's options, as `rlgw run --scaffold-option`."
    )
    sampling: dict[str, Any] | None = Field(
        None, description="The sessions' sampling (OpenAI names), as `rlgw run --sampling`."
    )
    ray: str | None = Field(
        None, description="A Ray address: the runs become Ray tasks on that cluster, as `rlgw run --ray`."
    )


class LossSpec(_Strict):
    """The objective (`rlgw.trainer.settings.LossConfig`)."""

    reduction: Reduction = Field(
        Reduction.PER_ROLLOUT_MEAN,
        description="`per_rollout_mean`: mean over each rollout's trainable tokens, then over rollouts; "
        "`per_token`: mean over the step's trainable tokens (long rollouts weigh more).",
    )
    clip_low: float = Field(0.2, description="PPO ratio clip below 1 (ratio >= 1 - clip_low).")
    clip_high: float = Field(0.2, description="PPO ratio clip above 1 (ratio <= 1 + clip_high).")
    dual_clip: float | None = Field(None, description="Dual-clip bound on negative advantages (None: off).")
    old_log_probs: Literal["rollout", "recompute"] = Field(
        "rollout",
        description="pi_old: the engine's `rollout_log_probs` (`rollout`), or the trainer's own before the "
        "update (`recompute`, the engine/trainer gap corrected by truncated IS).",
    )
    tis_cap: float | None = Field(None, description="Truncated importance-sampling cap with `recompute`.")
    kl_coef: float = Field(0.0, description="Weight of the K3 KL term (0: off).")
    kl_source: Literal["teacher", "reference"] = Field(
        "reference",
        description="KL against a frozen copy of the initial policy (`reference`) or the samples' "
        "`teacher_log_probs` (`teacher`, with a `teacher` block).",
    )
    entropy_coef: float = Field(0.0, description="Weight of the entropy bonus (0: off).")
    std_normalize: bool = Field(True, description="Divide GRPO advantages by the group's reward std.")


class OptimSpec(_Strict):
    """AdamW (`rlgw.trainer.settings.OptimConfig`)."""

    lr: float = Field(1e-5, ge=0, description="Learning rate (0: no update, a control run).")
    weight_decay: float = Field(0.0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    grad_clip: float | None = Field(1.0, description="Max global gradient norm (None: no clipping).")


class SyncSpec(_Strict):
    """How new weights reach the engines: disk versions, `delta` after the first full one, or `full`."""

    kind: Literal["delta", "full"] = Field(
        "delta", description="Publish deltas after the first full version, or every version full."
    )
    encoding: Literal["xor", "overwrite"] = Field("xor", description="How a delta encodes changed tensors.")
    engine_kind: Literal["rlgw", "vllm", "sglang"] = Field(
        "rlgw",
        description="`rlgw`: engines pull each version themselves (`/pull_weights`); `vllm`: pulled here and "
        "reloaded in place (`sync/vllm_reload.py`); `sglang`: pulled here and loaded with SGLang's "
        "`/update_weights_from_disk` (`sync/sglang_reload.py`).",
    )
    full_every: int = Field(
        1000,
        ge=1,
        description="Every n-th version is written full, so a new engine host replays no long chain.",
    )
    durable: bool = Field(True, description="fsync each published and applied version.")


class ParallelSpec(_Strict):
    """How the Megatron trainer is split: tensor- and pipeline-parallel sizes, data-parallel replicas.

    Launch tp * pp * dp processes (`rlgw train --nproc-per-node N` or `torchrun --nproc-per-node N
    -m rlgw.bin.main train ...`); rank 0 runs the loop.
    """

    tp: int = Field(1, ge=1, description="Tensor-parallel size.")
    pp: int = Field(1, ge=1, description="Pipeline-parallel size (stages, 1F1B).")
    dp: int = Field(1, ge=1, description="Data-parallel replicas.")
    ep: int = Field(
        1,
        ge=1,
        description="Expert-parallel size (a MoE model): megatron-core takes these ranks from the "
        "data-parallel ones, so it adds no processes and must divide dp.",
    )
    vocab_divisible_by: int = Field(
        128,
        ge=1,
        description="Pad the vocabulary to a multiple of this times tp, as Megatron-LM's "
        "`--make-vocab-size-divisible-by`.",
    )
    distributed_optimizer: bool = Field(
        False,
        description="Shard Adam state and update over the dp replicas (megatron-core's distributed "
        "optimizer: grads reduce-scattered, params all-gathered) instead of a whole AdamW on every replica; "
        "same step.",
    )

    @property
    def world(self) -> int:
        """Processes the split needs."""
        return self.tp * self.pp * self.dp

    @model_validator(mode="after")
    def _ep_divides_dp(self) -> ParallelSpec:
        if self.dp % self.ep:
            raise ValueError(
                f"parallel ep={self.ep} must divide dp={self.dp}: megatron-core takes the expert-parallel "
                f"ranks from the data-parallel ones (for ep={self.ep}, dp a multiple of it)"
            )
        return self


class MoeSpec(_Strict):
    """Mixture-of-experts training settings."""

    routing_replay: bool = Field(
        False,
        description=(
            "Rollout routing replay (R3): the trainer's forward routes each token to the experts the "
            "engine routed it to (the samples' `rollout_routed_experts`, which the gateway records for "
            "a MoE model), recomputing the router's weights over those experts, so small numeric "
            "differences cannot send a token through other experts at training than at rollout."
        ),
    )


class TeacherSpec(_Strict):
    """Force-decode each kept segment with a teacher: its `teacher_*` fields feed K3 (kl_source="teacher")."""

    url: str = Field(
        description='An SGLang-protocol engine, or "engine": the run\'s own first engine (self-distillation).'
    )
    top_k: int = Field(20, ge=0, description="Teacher top-k logprobs kept per response token.")


class WandbSpec(_Strict):
    """A Weights & Biases run for the receipts: offline by default (files under WORK_DIR/wandb)."""

    project: str = Field("rlgw", description="W&B project.")
    name: str | None = Field(None, description="W&B run name (None: W&B picks one).")
    mode: Literal["offline", "online"] = Field(
        "offline",
        description="`offline` writes files (`wandb sync` uploads them later); `online` uploads live.",
    )


class TrackingSpec(_Strict):
    """Where receipts go besides receipts.jsonl: TensorBoard event files (WORK_DIR/tensorboard), W&B."""

    tensorboard: bool = Field(
        True, description="Write each receipt as TensorBoard scalars under WORK_DIR/tensorboard."
    )
    wandb: WandbSpec | None = Field(None, description="Also log to a Weights & Biases run.")


class TrainConfig(_Strict):
    """Everything one `rlgw train` run needs."""

    model: str = Field(
        description="HF checkpoint directory: the trainer's start and (embedded) the engine's."
    )
    work_dir: str = Field(
        "rlgw-train", description="Receipts, logs, checkpoints, the store of an embedded gateway."
    )
    iterations: int = Field(10, ge=1, description="Rollout -> train -> publish iterations.")
    mode: Literal["sync", "async"] = Field(
        "sync", description="`async`: one-step-async, the next rollouts run while this step trains."
    )
    seed: int = Field(
        0, description="The run's seed: every attempt's session seed derives from it and its rollout id."
    )
    trainer: Literal["torch", "megatron"] = Field(
        "torch", description="The PyTorch trainer or the Megatron one."
    )
    device: str = Field("cpu", description="Torch device of the trainer.")
    threads: int | None = Field(1, description="Torch threads of the trainer (None: torch's default).")
    micro_batch_rows: int = Field(16, ge=1, description="Rows (segments) per forward/backward micro-batch.")
    gateway_url: str | None = Field(
        None, description="A running gateway (None: start `rlgw serve` with the embedded engine)."
    )
    gateway_key: str | None = Field(None, description="Tenant key for `gateway_url`.")
    engine_urls: list[str] = Field(
        default_factory=list, description="The engines new weights go to (needed with `gateway_url`)."
    )
    cache_mib: int | None = Field(
        None, ge=0, description="Embedded engine's prefix cache in MiB (None: its default, 1024; 0: off)."
    )
    rollouts: ChatRolloutsSpec | ToolRolloutsSpec | ScaffoldRolloutsSpec = Field(
        discriminator="kind", description="Where rollouts come from, by `kind`: `chat`, `tool` or `scaffold`."
    )
    loss: LossSpec = Field(default_factory=LossSpec, description="The objective.")
    optim: OptimSpec = Field(default_factory=OptimSpec, description="The optimizer.")
    acceptance: dict[Literal["completed", "truncated", "aborted", "failed"], Action] = Field(
        default_factory=dict,
        description="Per sample status: `keep`, `zero_reward` or `drop` (default: completed and truncated "
        "kept, aborted and failed dropped); a rollout takes its segments' strictest action.",
    )
    max_staleness: int | None = Field(
        None,
        description="Tokens more versions old are masked out (None: 0 in sync mode, 1 in one-step-async).",
    )
    sync: SyncSpec = Field(default_factory=SyncSpec, description="Weight publication to the engines.")
    teacher: TeacherSpec | None = Field(None, description="A teacher that force-decodes each kept segment.")
    tracking: TrackingSpec = Field(default_factory=TrackingSpec, description="Receipts' sinks.")
    parallel: ParallelSpec = Field(default_factory=ParallelSpec, description="The Megatron trainer's split.")
    moe: MoeSpec = Field(default_factory=MoeSpec, description="Mixture-of-experts settings.")

    @model_validator(mode="after")
    def _split_needs_megatron(self) -> TrainConfig:
        if (self.parallel.world > 1 or self.parallel.distributed_optimizer) and self.trainer != "megatron":
            raise ValueError(f"parallel {self.parallel.model_dump()} needs trainer: megatron")
        return self

    @classmethod
    def from_file(cls, path: Path) -> TrainConfig:
        """Read a `.json` or `.toml` file; relative paths in it stay relative to the working directory."""
        text = path.read_text()
        doc = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        return cls.model_validate(doc)

    def staleness_bound(self) -> int:
        """The staleness filter's bound in versions."""
        if self.max_staleness is not None:
            return self.max_staleness
        return 0 if self.mode == "sync" else 1

    def loss_config(self) -> LossConfig:
        """The objective's settings."""
        spec = self.loss.model_dump(exclude={"std_normalize"})
        return LossConfig(**spec)

    def optim_config(self) -> OptimConfig:
        """The optimizer's settings."""
        return OptimConfig(**self.optim.model_dump())

    def acceptance_policy(self) -> AcceptancePolicy:
        """The per-status actions (defaults where unset)."""
        return AcceptancePolicy(**{k: Action(v) for k, v in self.acceptance.items()})

    def trackers(self, config: dict[str, Any]) -> Trackers:
        """The receipts' sinks (`config` is the resolved config, for W&B's run config)."""
        t = self.tracking
        wandb = WandbSettings(t.wandb.project, t.wandb.name, t.wandb.mode) if t.wandb else None
        return Trackers(Path(self.work_dir), tensorboard=t.tensorboard, wandb=wandb, config=config)

    def rollout_source(self) -> RolloutSource:
        """The configured rollout source."""
        r = self.rollouts
        if isinstance(r, ChatRolloutsSpec):
            tasks = [WordTask(t["prompt"], t["word"]) for t in r.tasks]
            return ChatRollouts(
                tasks, r.groups, r.group_size, r.max_tokens, r.temperature, r.concurrency, self.seed
            )
        if isinstance(r, ToolRolloutsSpec):
            return ToolRollouts(r.groups, r.group_size, r.temperature, r.concurrency, self.seed)
        return ScaffoldRollouts(
            r.scaffold, r.tasks_file, r.groups, r.group_size, r.max_turns, r.concurrency, self.seed,
            r.scaffold_options, r.sampling, r.ray,
        )  # fmt: skip
