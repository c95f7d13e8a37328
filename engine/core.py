"""The engine: a scheduler and a model runner joined by one step loop on a background thread.

Owns the wiring and the loop, nothing else: `Scheduler` (`rlgw.engine.scheduler`) keeps the queue,
admission, pause and aborts behind its lock; `ModelRunner` (`rlgw.engine.runner`) runs prefill,
decode, sampling and stop checks; `rlgw.engine.weights` plans and applies weight updates. Callers
(the HTTP server, the weight-sync routes) use only `Engine`'s methods. Knows nothing about HTTP:
callers hand in `Request`s with a `sink` callback and receive `Update`s on it (called from the engine
thread; the server hops them onto its event loop).

One loop iteration: the scheduler applies aborts/retraction/flushes and admits; then up to
`chunked_prefill_size` prompt tokens are prefilled (SGLang's name; a long prompt does not stall the
requests already decoding), a request whose prefill completes joins the batch, and one decode step
runs over every running request.

Weight-sync contract (used by `rlgw.sync.engine_routes` and `/update_weights_from_disk`):
- `await pause(mode)` / `await resume()`: SGLang's three pause modes (see the scheduler).
- `flush_cache() -> bool`: drops every kept KV and the prefix cache; False (nothing done) while
  requests are running and the engine is not paused.
- `await update_weights(named_tensors, version)`: validates every name/shape/dtype against the live
  model before changing anything (`WeightUpdateError`); if not paused, stops admitting and waits for
  running requests to finish; copies under no_grad and clears the prefix cache under the step lock;
  flushes KV; sets `weight_version`.
- `await load_weights_from_dir(path, version)`: reads a safetensors checkpoint and applies it.
- properties `weight_version`, `model`, `model_path`, `tokenizer`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from rlgw.engine import weights
from rlgw.engine.batch import cache_kv
from rlgw.engine.grammar import Constraint, Matcher
from rlgw.engine.prefix_cache import KV, PrefixCache
from rlgw.engine.request import Request, aborted
from rlgw.engine.runner import ModelRunner, load_model
from rlgw.engine.scheduler import Scheduler

log = logging.getLogger(__name__)


@dataclass(slots=True)
class EngineConfig:
    """Knobs of the engine core."""

    max_queue: int = 256
    max_running: int = 32
    threads: int = 1
    weight_version: str = "default"
    served_model_name: str | None = None
    original_logprob: bool = False
    chunked_prefill_size: int = 512  # prompt tokens prefilled between two decode steps
    cache_mib: int = 1024  # the prefix cache's budget (MiB of KV); 0 disables it


class Engine:
    """A CPU transformers model behind a request queue and a batching step loop.

    Features: bounded queue (QueueFullError), batched decode across running requests, per-request
    seeded sampling, constrained decoding (xgrammar, per-request matchers in a mixed batch), prompt
    logprobs (teacher forcing) in bounded memory, stop ids/strings, aborts, three pause modes, live
    weight updates, a prefix cache of finished requests' KV (cleared by every weight update and
    flush). Trade-offs: one process-wide thread does all compute (no overlap of tokenization with
    compute).
    """

    def __init__(self, model_path: Path, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        torch.set_num_threads(self.config.threads)
        self._model_path = Path(model_path)
        model, tokenizer = load_model(self._model_path)
        self.prefix = PrefixCache(self.config.cache_mib * 2**20)
        self.runner = ModelRunner(model, tokenizer, self.prefix, self.config.original_logprob)
        self._weight_version = self.config.weight_version
        self.scheduler = Scheduler(
            self.config.max_queue,
            self.config.max_running,
            lambda r: self.runner.snapshot(r, self._weight_version),
        )
        self.started_at = time.time()
        self._thread = threading.Thread(target=self._loop, name="rlgw-engine", daemon=True)
        self._thread.start()

    # -- properties -------------------------------------------------------------------------------

    @property
    def weight_version(self) -> str:
        """The version of the weights being served."""
        return self._weight_version

    @property
    def model(self) -> torch.nn.Module:
        """The live torch module."""
        return self.runner.model

    @property
    def model_path(self) -> Path:
        """The checkpoint directory the engine started from."""
        return self._model_path

    @property
    def tokenizer(self):
        """The Hugging Face tokenizer of the model."""
        return self.runner.tokenizer

    @property
    def max_context_length(self) -> int | None:
        """The model's position limit (None when its config gives none)."""
        return self.runner.max_context_length

    @property
    def eos_ids(self) -> list[int]:
        """Token ids that end a generation unless `ignore_eos`."""
        return self.runner.eos_ids

    @property
    def paused(self) -> bool:
        """True between `pause()` and `resume()`."""
        return self.scheduler.paused

    @property
    def alive(self) -> bool:
        """True while the step loop thread runs."""
        return self._thread.is_alive() and not self.scheduler.stopped

    def load_stats(self) -> dict[str, int]:
        """Queue and batch sizes."""
        return self.scheduler.load_stats()

    # -- requests ---------------------------------------------------------------------------------

    @property
    def is_moe(self) -> bool:
        """True when the model routes tokens to experts (it can report routed experts)."""
        return self.runner.routing.is_moe

    def check_request(self, input_ids: list[int], logprob_start_len: int) -> None:
        """Raise `RequestError` if a prompt cannot run on this model."""
        self.runner.check(input_ids, logprob_start_len)

    def grammar_matcher(self, constraint: Constraint) -> Matcher:
        """A fresh matcher for `constraint` (`GrammarError` if it does not compile). Compiles on the
        caller's thread, seconds for a large schema: call it off the event loop."""
        return self.runner.grammars.matcher(constraint)

    def submit(self, reqs: list[Request]) -> None:
        """Queue `reqs` together, or none of them (`QueueFullError` when the queue lacks room)."""
        self.scheduler.submit(reqs)

    def abort(self, rid: str | None = None, abort_all: bool = False) -> int:
        """Abort the live request `rid` (exact match) or every live one; returns how many were hit."""
        return self.scheduler.abort(rid, abort_all)

    async def pause(self, mode: str = "abort") -> None:
        """Pause generation ("abort", "retract" or "in_place"); returns once the loop is parked."""
        await self.scheduler.pause(mode)

    async def resume(self) -> None:
        """Continue generation after `pause`."""
        await self.scheduler.resume()

    def flush_cache(self) -> bool:
        """Drop every kept KV cache, the prefix cache's too; False (nothing dropped) if requests are
        running and the engine is not paused."""
        if not self.scheduler.flush_cache():
            return False
        self.prefix.clear()
        return True

    # -- weights ----------------------------------------------------------------------------------

    async def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: str | None
    ) -> None:
        """Copy `named_tensors` (HF names) into the live model and set `weight_version`.

        Validates everything first (`WeightUpdateError`, nothing changed). If generation is not
        paused, new requests wait and running ones are allowed to finish before the copy.
        `version=None` keeps the current version string.
        """
        plan = weights.plan_update(self.model, named_tensors)
        with self.scheduler.admission_held():
            await asyncio.to_thread(self._apply_when_quiet, plan, version)

    def _apply_when_quiet(self, plan: weights.Plan, version: str | None) -> None:
        self.scheduler.wait_quiet()
        with self.scheduler.step_lock:
            weights.apply(plan)
            # Under the step lock: no step sees the new weights with a prefix of the old ones.
            self.prefix.clear()
            if version is not None:
                self._weight_version = version
        self.scheduler.flush_cache()
        log.info(
            "weights updated",
            extra={"fields": {"weight_version": self._weight_version, "tensors": len(plan)}},
        )

    async def load_weights_from_dir(self, path: Path, version: str | None) -> int:
        """Apply a safetensors checkpoint directory to the live model; returns the tensor count."""
        tensors = await asyncio.to_thread(weights.read_safetensors_dir, Path(path))
        await self.update_weights(tensors.items(), version)
        return len(tensors)

    # -- lifecycle --------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Abort everything and stop the step loop."""
        self.scheduler.stop()
        self._thread.join(timeout=10)

    # -- the step loop (engine thread) ------------------------------------------------------------

    def _loop(self) -> None:
        torch.set_num_threads(self.config.threads)
        while self.scheduler.next_step():
            try:
                with self.scheduler.step_lock, torch.inference_mode():
                    self._step()
            except Exception as exc:  # a model/runtime failure must not leave callers hanging
                log.exception("engine step failed")
                self.scheduler.fail_all(exc)

    def _step(self) -> None:
        """Up to `chunked_prefill_size` prompt tokens of prefill, then one decode step."""
        sched, runner = self.scheduler, self.runner
        budget = self.config.chunked_prefill_size
        while sched.prefilling and budget > 0:
            req = sched.prefilling[0]
            if req.abort_requested:
                sched.prefilling.pop(0)
                sched.finish(req, aborted())
                continue
            fed, complete, reason = runner.prefill(req, budget)
            budget -= fed
            if complete:
                sched.prefilling.pop(0)
                if reason is not None:
                    self._remember(req, reason, cache_kv(req.kv))
                if self._settle(req, reason):
                    sched.batch.add(req)
        if sched.batch:
            reasons = runner.decode(sched.batch)
            for row, (req, reason) in enumerate(zip(sched.batch.reqs, reasons, strict=True)):
                if reason is not None:
                    self._remember(req, reason, sched.batch.row_kv(row))
                self._settle(req, reason)
            sched.drop_finished()

    def _remember(self, req: Request, reason: dict, kv: KV) -> None:
        """Hand a request that finished normally (stop, length) to the prefix cache; an aborted or
        failed one leaves nothing."""
        if reason.get("type") == "abort":
            return
        n = kv[0][0].shape[2]
        self.prefix.insert((req.input_ids + req.output_ids)[:n], kv, req.cache_epoch)

    def _settle(self, req: Request, reason: dict | None) -> bool:
        """Finish `req` with `reason`, or stream it if due; True while it keeps running."""
        if reason is not None:
            self.scheduler.finish(req, reason)
            return False
        if req.stream_due():
            req.sink(self.runner.snapshot(req, self._weight_version))
        return True
