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

    kind: Literal["chat"] = "chat"
    tasks: list[dict[str, str]] = Field(min_length=1)  # {"prompt": ..., "word": ...}
    groups: int = Field(4, ge=1)
    group_size: int = Field(8, ge=2)
    max_tokens: int = Field(8, ge=1)
    temperature: float = Field(1.0, gt=0)
    concurrency: int = Field(16, ge=1)


class ToolRolloutsSpec(_Strict):
    """The built-in two-turn tool task (`rlgw.trainer.tool_task`): call `locate`, answer with its city."""

    kind: Literal["tool"]
    groups: int = Field(4, ge=1)
    group_size: int = Field(8, ge=2)
    temperature: float = Field(1.0, gt=0)
    concurrency: int = Field(16, ge=1)


class ScaffoldRolloutsSpec(_Strict):
    """Installed scaffolds on a tasks file (see `rlgw run`)."""

    kind: Literal["scaffold"]
    scaffold: str
    tasks_file: str
    groups: int = Field(2, ge=1)
    group_size: int = Field(4, ge=2)
    max_turns: int = Field(4, ge=1)
    concurrency: int = Field(4, ge=1)
    scaffold_options: dict[str, Any] = Field(default_factory=dict)
    sampling: dict[str, Any] | None = None
    ray: str | None = None  # a Ray address: the runs become Ray tasks on that cluster (as `rlgw run --ray`)


class LossSpec(_Strict):
    """See `rlgw.trainer.objective.LossConfig`."""

    reduction: Reduction = Reduction.PER_ROLLOUT_MEAN
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    old_log_probs: Literal["rollout", "recompute"] = "rollout"
    tis_cap: float | None = None
    kl_coef: float = 0.0
    kl_source: Literal["teacher", "reference"] = "reference"
    entropy_coef: float = 0.0
    std_normalize: bool = True


class OptimSpec(_Strict):
    """AdamW; see `rlgw.trainer.settings.OptimConfig`."""

    lr: float = Field(1e-5, ge=0)
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float | None = 1.0


class SyncSpec(_Strict):
    """How new weights reach the engines: disk versions, `delta` after the first full one, or `full`."""

    kind: Literal["delta", "full"] = "delta"
    encoding: Literal["xor", "overwrite"] = "xor"
    # rlgw: engines pull themselves (/pull_weights); vllm: pulled here, reloaded in place (vllm_reload.py).
    engine_kind: Literal["rlgw", "vllm"] = "rlgw"
    full_every: int = Field(1000, ge=1)
    durable: bool = True


class ParallelSpec(_Strict):
    """How the Megatron trainer is split: tensor- and pipeline-parallel sizes, data-parallel replicas.

    Launch tp * pp * dp processes (`rlgw train --nproc-per-node N` or `torchrun --nproc-per-node N
    -m rlgw.bin.main train ...`); rank 0 runs the loop. `vocab_divisible_by` pads the vocabulary as
    Megatron-LM's `--make-vocab-size-divisible-by` does (times tp). `ep` (a MoE model) spreads the
    experts over that many ranks; megatron-core takes them from the data-parallel ranks, so it
    adds no processes and must divide dp. `distributed_optimizer` shards the Adam state and update
    over the dp replicas (megatron-core's distributed optimizer: grads reduce-scattered, params
    all-gathered) instead of a whole AdamW on every replica; same step.
    """

    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    vocab_divisible_by: int = Field(128, ge=1)
    distributed_optimizer: bool = False

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

    url: str  # an SGLang-protocol engine, or "engine": the run's own first engine (self-distillation)
    top_k: int = Field(20, ge=0)


class WandbSpec(_Strict):
    """A Weights & Biases run for the receipts: offline by default (files under WORK_DIR/wandb)."""

    project: str = "rlgw"
    name: str | None = None
    mode: Literal["offline", "online"] = "offline"


class TrackingSpec(_Strict):
    """Where receipts go besides receipts.jsonl: TensorBoard event files (WORK_DIR/tensorboard), W&B."""

    tensorboard: bool = True
    wandb: WandbSpec | None = None


class TrainConfig(_Strict):
    """Everything one `rlgw train` run needs."""

    model: str  # HF checkpoint directory: the trainer's start and (embedded) the engine's
    work_dir: str = "rlgw-train"
    iterations: int = Field(10, ge=1)
    mode: Literal["sync", "async"] = "sync"
    seed: int = 0
    trainer: Literal["torch", "megatron"] = "torch"
    device: str = "cpu"
    threads: int | None = 1
    micro_batch_rows: int = Field(16, ge=1)
    gateway_url: str | None = None  # None: start `rlgw serve` with the embedded engine
    gateway_key: str | None = None
    engine_urls: list[str] = Field(default_factory=list)  # needed with gateway_url
    cache_mib: int | None = Field(None, ge=0)  # embedded engine prefix cache MiB (None: default; 0: off)
    rollouts: ChatRolloutsSpec | ToolRolloutsSpec | ScaffoldRolloutsSpec = Field(discriminator="kind")
    loss: LossSpec = Field(default_factory=LossSpec)
    optim: OptimSpec = Field(default_factory=OptimSpec)
    acceptance: dict[Literal["completed", "truncated", "aborted", "failed"], Action] = Field(
        default_factory=dict
    )
    max_staleness: int | None = None  # default: 0 in sync mode, 1 in one-step-async
    sync: SyncSpec = Field(default_factory=SyncSpec)
    teacher: TeacherSpec | None = None
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    parallel: ParallelSpec = Field(default_factory=ParallelSpec)  # the Megatron trainer's split
    moe: MoeSpec = Field(default_factory=MoeSpec)

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
