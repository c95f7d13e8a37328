"""The RL loop: rollouts through the gateway -> consume -> train -> publish weights -> engines serve them.

    v0 = publish(initial weights, full); every engine pulls v0
    for each iteration:
        collect rollouts (sessions on the gateway)       # async mode: already running since last train
        read their samples from the stream, to rollouts  # acceptance per status, staleness filter
        one optimizer step (GRPO advantages, PPO loss)
        publish v+1 (delta on disk); every engine pulls it; the fleet reports v+1
        acknowledge the samples; write the receipt

Modes: `sync` (the next rollouts start after the sync) and `async` (one-step-async: the next
iteration's rollouts run while this one trains, so their tokens are up to one version old; the
staleness filter bounds that). `--dump-rollouts` writes each iteration's consumed samples as JSON
lines; `--replay` trains on such dumps without a gateway or engine. This module composes the
parts; it owns none of their logic.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import torch
from tqdm import tqdm

from rlgw.gateway.engine_semantics import EngineSemantics
from rlgw.gateway.sample import Sample
from rlgw.gateway.trajectories.client import GatewayClient, StoredTrajectory
from rlgw.trainer.base import Trainer
from rlgw.trainer.batch import build_step
from rlgw.trainer.config import TrainConfig
from rlgw.trainer.consumer import TrajectoryConsumer, reward_stats, to_rollouts
from rlgw.trainer.rollouts import CollectResult
from rlgw.trainer.services import Services, local_services
from rlgw.trainer.tracking import Trackers, summary_line


def build_trainer(cfg: TrainConfig) -> Trainer:
    """The configured trainer backend, loaded from `cfg.model`."""
    if cfg.trainer == "megatron":
        from rlgw.trainer.megatron_trainer import MegatronTrainer

        par = cfg.parallel
        return MegatronTrainer(
            Path(cfg.model), cfg.loss_config(), cfg.optim_config(), device=cfg.device, seed=cfg.seed,
            tp=par.tp, pp=par.pp, dp=par.dp, ep=par.ep, vocab_divisible_by=par.vocab_divisible_by,
            distributed_optimizer=par.distributed_optimizer, routing_replay=cfg.moe.routing_replay,
        )  # fmt: skip
    from rlgw.trainer.torch_trainer import TorchTrainer

    return TorchTrainer(
        Path(cfg.model),
        cfg.loss_config(),
        cfg.optim_config(),
        device=cfg.device,
        seed=cfg.seed,
        routing_replay=cfg.moe.routing_replay,
    )


@contextlib.asynccontextmanager
async def _services(cfg: TrainConfig, work: Path) -> AsyncIterator[Services]:
    if cfg.gateway_url:
        if not cfg.engine_urls:
            raise ValueError("gateway_url needs engine_urls (the engines to sync weights to)")
        yield Services(cfg.gateway_url, cfg.gateway_key, list(cfg.engine_urls))
        return
    with local_services(cfg.model, work, engine_threads=cfg.threads or 1, cache_mib=cfg.cache_mib) as svc:
        yield svc


@dataclass
class WeightSync:
    """Publishes the trainer's weights as disk versions and brings every engine to them."""

    root: Path
    local_dir: Path
    engine_urls: list[str]
    model_dir: Path
    kind: str
    encoding: str
    full_every: int
    durable: bool
    engine_kind: str = "rlgw"

    def __post_init__(self) -> None:
        from rlgw.sync.client import SyncClient
        from rlgw.sync.publisher import WeightPublisher

        self.publisher = WeightPublisher(
            self.root,
            encoding=self.encoding,
            full_every=self.full_every,
            aux_src=self.model_dir,
            durable=self.durable,
        )
        self.client = SyncClient(self.engine_urls)

    async def push(self, trainer: Trainer, version: int) -> dict[str, Any]:
        """Publish `version` (full first, then the configured kind) and have every engine serve it."""
        kind = "full" if self.publisher.index is None else self.kind
        index = await asyncio.to_thread(self.publisher.publish, trainer.export_weights(), version, kind)
        if self.engine_kind in ("vllm", "sglang"):
            # Engines that cannot pull: the version is pulled here and loaded through their own route.
            reload = importlib.import_module(f"rlgw.sync.{self.engine_kind}_reload")
            await reload.apply_version(
                self.engine_urls, self.root, version, self.local_dir, durable=self.durable
            )
            served = await reload.served_versions(self.engine_urls)
        else:
            await self.client.pull(self.root, version, self.local_dir, durable=self.durable)
            served = [s.weight_version for s in await self.client.status(live=False)]
        return {
            "version": version,
            "kind": index.kind,
            "checkpoint_digest": index.checkpoint_digest,
            "served_versions": served,
        }


async def _connect_teacher(cfg: TrainConfig, svc: Services) -> Any:
    from transformers import AutoTokenizer

    from rlgw.gateway.teacher.client import TeacherBackend

    assert cfg.teacher is not None
    url = svc.engine_urls[0] if cfg.teacher.url == "engine" else cfg.teacher.url
    student = await asyncio.to_thread(AutoTokenizer.from_pretrained, cfg.model)
    return await TeacherBackend.connect(url, student_tokenizer=student)


def not_repeatable(items: list[StoredTrajectory]) -> str | None:
    """Why these samples could come out otherwise from the same seed (their engine ignores seeds:
    SGLang without --enable-deterministic-inference), or None."""
    for t in items:
        doc = t.sample.metadata.get("engine")
        if isinstance(doc, dict) and doc.get("seed_honoured") is False:
            return EngineSemantics.from_metadata(doc).not_repeatable_reason()
    return None


def _dump(path: Path, items: list[StoredTrajectory]) -> None:
    with open(path, "wb") as f:
        for t in items:
            doc = {"cursor": t.cursor, "session_id": t.session_id, "task_id": t.task_id, "segment": t.segment,
                   "created_at": t.created_at, **t.sample.to_dict(numpy=True)}  # fmt: skip
            f.write(orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")


def load_dump(path: Path) -> list[StoredTrajectory]:
    """Read a `--dump-rollouts` file (JSON lines, validated through `Sample.from_dict`; no pickle)."""
    out = []
    for line in path.read_bytes().splitlines():
        if line.strip():
            doc = orjson.loads(line)
            meta = {k: doc.pop(k) for k in ("cursor", "session_id", "task_id", "segment", "created_at")}
            out.append(StoredTrajectory(sample=Sample.from_dict(doc), **meta))
    return out


class Loop:
    """One training run; `run()` returns the receipts it wrote."""

    def __init__(self, cfg: TrainConfig, *, progress: bool = True, dump_dir: Path | None = None,
                 replay_dir: Path | None = None) -> None:  # fmt: skip
        self.cfg = cfg
        self.work = Path(cfg.work_dir)
        self.work.mkdir(parents=True, exist_ok=True)
        self.progress, self.dump_dir, self.replay_dir = progress, dump_dir, replay_dir
        self.teacher: Any = None
        self.trackers: Trackers | None = None  # opened by run()
        self.receipts_path = self.work / "receipts.jsonl"
        resolved = cfg.model_dump(mode="json")
        self.resolved = resolved
        self.config_digest = hashlib.sha256(json.dumps(resolved, sort_keys=True).encode()).hexdigest()[:16]

    async def run(self) -> list[dict[str, Any]]:
        """Run every iteration (or replay the dumps); returns the receipts."""
        cfg = self.cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        trainer = await asyncio.to_thread(build_trainer, cfg)
        self.trackers = trackers = cfg.trackers(self.resolved)
        try:
            if self.replay_dir is not None:
                return await self._replay(trainer)
            return await self._run(trainer)
        finally:
            trackers.close()
            trainer.close()

    async def _run(self, trainer: Trainer) -> list[dict[str, Any]]:
        cfg = self.cfg
        if self.dump_dir is not None:
            self.dump_dir.mkdir(parents=True, exist_ok=True)
        async with _services(cfg, self.work) as svc, GatewayClient(svc.gateway_url, svc.gateway_key) as gw:
            sync = WeightSync(
                self.work / "weights", self.work / "engine-checkpoint", svc.engine_urls, Path(cfg.model),
                cfg.sync.kind, cfg.sync.encoding, cfg.sync.full_every, cfg.sync.durable, cfg.sync.engine_kind,
            )  # fmt: skip
            consumer = TrajectoryConsumer(gw, self.work / "consumer.cursor")
            if cfg.teacher is not None:
                self.teacher = await _connect_teacher(cfg, svc)
            version = 0
            first = await sync.push(trainer, version)
            source = cfg.rollout_source()
            receipts = []
            bar = tqdm(total=cfg.iterations, desc=f"train ({cfg.mode})", unit="it", disable=not self.progress)
            pending: asyncio.Task[CollectResult] | None = None
            try:
                for it in range(cfg.iterations):
                    t0 = time.perf_counter()
                    if pending is None:
                        pending = asyncio.create_task(source.collect(svc.gateway_url, svc.gateway_key, it))
                    collected = await pending
                    pending = None
                    items = (
                        await consumer.read_through(collected.last_cursor)
                        if collected.last_cursor is not None
                        else []
                    )
                    t_rollout = time.perf_counter() - t0
                    if cfg.mode == "async" and it + 1 < cfg.iterations:
                        # one-step-async: the next rollouts run on the current weights while we train
                        pending = asyncio.create_task(
                            source.collect(svc.gateway_url, svc.gateway_key, it + 1)
                        )
                    receipt = await self._iteration(it, trainer, sync, version, items, collected, t_rollout)
                    version += 1
                    if items:
                        consumer.ack(items[-1].cursor)
                    receipt["served_at_start"] = first["served_versions"] if it == 0 else None
                    receipts.append(receipt)
                    self._write(receipt)
                    bar.update(1)
                    bar.set_postfix_str(f"v{version}")
                    bar.write(summary_line(receipt))
            finally:
                bar.close()
                if pending is not None:
                    pending.cancel()
                    with contextlib.suppress(BaseException):
                        await pending
                if self.teacher is not None:
                    await self.teacher.aclose()
        return receipts

    async def _iteration(self, it: int, trainer: Trainer, sync: WeightSync | None, version: int,
                         items: list[StoredTrajectory], collected: CollectResult | None,
                         t_rollout: float) -> dict[str, Any]:  # fmt: skip
        cfg = self.cfg
        if self.dump_dir is not None:
            _dump(self.dump_dir / f"iteration-{it:05d}.jsonl", items)
        rollouts, stats = to_rollouts(
            items, cfg.acceptance_policy(), current_version=version, max_staleness=cfg.staleness_bound()
        )
        mean, std = reward_stats(rollouts)
        if self.teacher is not None and rollouts:
            await self._capture_teacher(rollouts)
        t1 = time.perf_counter()
        metrics: dict[str, float] = {}
        if rollouts:
            step = build_step(
                rollouts, micro_batch_rows=cfg.micro_batch_rows, std_normalize=cfg.loss.std_normalize
            )
            metrics = await asyncio.to_thread(trainer.train_step, step)
        t_train = time.perf_counter() - t1
        t2 = time.perf_counter()
        pushed = await sync.push(trainer, version + 1) if sync is not None else None
        t_sync = time.perf_counter() - t2
        total = t_rollout + t_train + t_sync
        return {
            "iteration": it,
            "mode": cfg.mode,
            "config_digest": self.config_digest,
            "config": self.resolved,
            "version_trained_from": version,
            "published": pushed,
            "samples": len(items),
            "samples_by_status": stats.samples_by_status,
            "rollouts": stats.rollouts_kept,
            "rollouts_dropped": stats.rollouts_dropped,
            "stale_tokens_masked": stats.stale_tokens_masked,
            "max_staleness": stats.max_staleness,
            "rejected_segments": collected.rejected_segments if collected else 0,
            "failed_runs": collected.failed_runs if collected else 0,
            "trainable_tokens": int(sum(r.trainable_tokens for r in rollouts)),
            "reward_mean": mean,
            "reward_std": std,
            "losses": metrics,
            "kl": metrics.get("kl"),
            # Trainer vs engine on the tokens trained (the weights that sampled them, before the step):
            # 0 and 1 when the trainer's logprobs are the engine's.
            "logprob_gap_max": metrics.get("logprob_gap_max"),
            "is_ratio_mean": metrics.get("ratio_mean"),
            # The engine's logprob semantics as the samples recorded them, and whether its seeds
            # hold: None when they do, else why this run cannot be repeated from its seed.
            "engine": items[0].sample.metadata.get("engine") if items else None,
            "not_repeatable": not_repeatable(items),
            "seconds": {"rollout": t_rollout, "train": t_train, "sync": t_sync, "total": total},
            "share": {
                k: (v / total if total else 0.0)
                for k, v in (("rollout", t_rollout), ("train", t_train), ("sync", t_sync))
            },
        }

    async def _capture_teacher(self, rollouts: list) -> None:
        """Role B on every kept segment; a persistent teacher failure propagates and stops the run."""
        assert self.teacher is not None and self.cfg.teacher is not None
        k = self.cfg.teacher.top_k
        for r in rollouts:
            r.segments = list(await asyncio.gather(*(self.teacher.capture(s, k) for s in r.segments)))

    async def _replay(self, trainer: Trainer) -> list[dict[str, Any]]:
        assert self.replay_dir is not None
        receipts = []
        files = sorted(self.replay_dir.glob("iteration-*.jsonl"))
        if not files:
            raise FileNotFoundError(f"{self.replay_dir} holds no iteration-*.jsonl dumps")
        for it, path in enumerate(tqdm(files, desc="replay", unit="it", disable=not self.progress)):
            items = load_dump(path)
            versions = [
                int(v) for v in {s.version for t in items for s in t.sample.weight_versions} if v.isdigit()
            ]
            receipt = await self._iteration(it, trainer, None, max(versions, default=0), items, None, 0.0)
            receipt["replayed_from"] = str(path)
            receipts.append(receipt)
            self._write(receipt)
            tqdm.write(summary_line(receipt))
        return receipts

    def _write(self, receipt: dict[str, Any]) -> None:
        with open(self.receipts_path, "ab") as f:
            f.write(orjson.dumps(receipt) + b"\n")
        if self.trackers is not None:
            self.trackers.log(receipt)
