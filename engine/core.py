"""The engine core: request queue, scheduler and model runner, in one background thread.

Owns: admitting requests (bounded waiting queue, bounded running batch), prefill, batched decode
with a KV cache per request, sampling, stop conditions, aborts, pause/continue, and live weight
updates. Knows nothing about HTTP: callers hand in `Request`s with a `sink` callback and receive
`Update`s on it (called from the engine thread; the server hops them onto its event loop).

Batching: running requests share one left-padded batch cache (a `DynamicCache` of
[B, heads, T, head_dim] per layer, an attention mask [B, T] and explicit position ids). Each decode
step is one forward over all running requests. The batch is rebuilt only when membership changes:
finished rows are dropped (and all-padding columns trimmed), a newly prefilled request is left-padded
into it. Prefill is chunked (`chunked_prefill_size` prompt tokens per loop iteration, SGLang's name),
each chunk its own forward between two decode steps, so a long prompt does not stall the requests
that are already decoding.

Weight-sync contract (used by `rlgw.engine.weight_sync_routes` and `/update_weights_from_disk`):
- `await pause(mode)`: "abort" aborts everything and waits for it to drain; "retract" moves running
  requests back to the queue (their KV is dropped, they are re-prefilled from prompt + output so
  far on continue); "in_place" freezes the step loop with the KV kept. New requests queue up.
- `await resume()`: unpause.
- `flush_cache() -> bool`: drops every kept KV (paused in-place requests get re-prefilled); False
  (nothing done) while requests are running and the engine is not paused.
- `await update_weights(named_tensors, version)`: validates every name/shape/dtype against the live
  model before changing anything (`WeightUpdateError`); if not paused, stops admitting and waits for
  running requests to finish; copies under no_grad; flushes KV; sets `weight_version`.
- `await load_weights_from_dir(path, version)`: reads a safetensors checkpoint (one file, several,
  or sharded with `model.safetensors.index.json`) and applies it through `update_weights`.
- properties `weight_version`, `model`, `model_path`, `tokenizer`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import torch

from rlgw.engine.batch import BatchCache, new_cache
from rlgw.engine.sampling import SamplerRow, SamplingParams, make_generator, sample, scaled_logprobs

log = logging.getLogger(__name__)

# Prompt rows whose logits are materialized at once when computing input logprobs (bounds memory
# for long teacher-forcing calls on large vocabularies).
LOGIT_CHUNK = 256


class EngineError(RuntimeError):
    """Base of the engine core's errors.

    EngineError
     ├── QueueFullError       the waiting queue cannot take the request(s) (HTTP 503)
     ├── RequestError         the request is invalid for this model (HTTP 400)
     └── WeightUpdateError    a weight update does not fit the live model; nothing was changed
    """


class QueueFullError(EngineError):
    """The bounded waiting queue is full."""


class RequestError(EngineError):
    """A request that cannot run on this model (too long, bad token ids, bad logprob_start_len)."""


class WeightUpdateError(EngineError):
    """Named tensors that do not match the live model (unknown name, shape or dtype)."""


class Phase(Enum):
    """Where a request is in its lifecycle."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, frozen=True)
class Update:
    """A snapshot of a request's progress, delivered to its sink.

    Output lists on the request only ever grow, so `n_out` pins what this snapshot covers.
    """

    n_out: int
    text: str
    finish_reason: dict | None
    weight_version: str
    e2e_latency: float | None


@dataclass(eq=False)
class Request:
    """One generation (one sample of one prompt)."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    sink: Callable[[Update], None]
    stream: bool = False
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    created: float = field(default_factory=time.monotonic)
    # Filled by the engine.
    phase: Phase = Phase.WAITING
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_logprobs: list[float | None] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
    finish_reason: dict | None = None
    prefilled: bool = False  # prompt logprobs done and first token sampled
    prefill_done: int = 0  # tokens of the current prefill already in `kv`
    num_retractions: int = 0
    abort_requested: bool = False
    generator: torch.Generator | None = None
    kv: object | None = None  # own DynamicCache between prefill and joining the batch
    last_emit: int = 0

    def __post_init__(self) -> None:
        self.generator = make_generator(self.params.sampling_seed)

    @property
    def seq_len(self) -> int:
        """Tokens in the sequence so far (prompt + output; the last output id is not yet in the cache)."""
        return len(self.input_ids) + len(self.output_ids)


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


class Engine:
    """A CPU transformers model behind a request queue and a batching step loop.

    Features: bounded queue (QueueFullError), batched decode across running requests, per-request
    seeded sampling, prompt logprobs (teacher forcing) in bounded memory, stop ids/strings, aborts,
    three pause modes, live weight updates. Trade-offs: fp32 only; one process-wide thread does all
    compute (no overlap of tokenization with compute); no prefix cache (`cached_tokens` is always 0).
    """

    def __init__(self, model_path: Path, config: EngineConfig | None = None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = config or EngineConfig()
        torch.set_num_threads(self.config.threads)
        self._model_path = Path(model_path)
        self._tokenizer = AutoTokenizer.from_pretrained(str(self._model_path))
        model = AutoModelForCausalLM.from_pretrained(str(self._model_path), dtype=torch.float32)
        model.eval()
        _check_supported(model)
        self._model = model
        self._base = model.get_decoder()
        self._lm_head = model.get_output_embeddings()
        # transformers renamed `past_key_values` to `cache`; use whichever this version takes.
        params = inspect.signature(self._base.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._weight_version = self.config.weight_version
        self.max_context_length = int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self.eos_ids = _eos_ids(model, self._tokenizer)
        self.started_at = time.time()

        self._cond = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._batch = BatchCache()
        self._prefilling: list[Request] = []  # admitted, prefill in progress (engine thread only)
        self._by_rid: dict[str, Request] = {}
        self._paused = False
        self._hold_admission = 0  # >0 while a weight update waits for running requests to drain
        self._retract_requested = False
        self._flush_requested = False
        self._parked = False  # the loop is waiting on the condition, between steps
        self._stopped = False
        self._step_lock = threading.Lock()  # held for the duration of every compute step
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
        return self._model

    @property
    def model_path(self) -> Path:
        """The checkpoint directory the engine started from."""
        return self._model_path

    @property
    def tokenizer(self):
        """The Hugging Face tokenizer of the model."""
        return self._tokenizer

    @property
    def paused(self) -> bool:
        """True between `pause()` and `resume()`."""
        return self._paused

    @property
    def alive(self) -> bool:
        """True while the step loop thread runs."""
        return self._thread.is_alive() and not self._stopped

    def load_stats(self) -> dict[str, int]:
        """Queue and batch sizes."""
        with self._cond:
            running = sum(1 for r in self._by_rid.values() if r.phase is Phase.RUNNING)
            return {"num_waiting": len(self._waiting), "num_running": running}

    # -- submission and abort ----------------------------------------------------------------------

    def check_request(self, input_ids: list[int], params: SamplingParams, logprob_start_len: int) -> None:
        """Raise `RequestError` if a prompt cannot run on this model."""
        if not input_ids:
            raise RequestError("the input is empty: give at least one token")
        bad = [t for t in input_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestError(f"token id {bad[0]} is out of range for a vocabulary of {self.vocab_size}")
        if self.max_context_length is not None and len(input_ids) >= self.max_context_length:
            raise RequestError(
                f"The input ({len(input_ids)} tokens) is longer than the model's context length "
                f"({self.max_context_length} tokens)."
            )
        if logprob_start_len >= len(input_ids):
            raise RequestError(
                f"logprob_start_len ({logprob_start_len}) must be less than the input length "
                f"({len(input_ids)})"
            )

    def submit(self, reqs: list[Request]) -> None:
        """Queue `reqs` together, or none of them (`QueueFullError` when the queue lacks room)."""
        with self._cond:
            if len(self._waiting) + len(reqs) > self.config.max_queue:
                raise QueueFullError(
                    f"The engine's waiting queue is full ({len(self._waiting)}/{self.config.max_queue} "
                    f"requests waiting); retry later or start the engine with a larger --max-queue."
                )
            for r in reqs:
                if r.rid in self._by_rid:
                    raise RequestError(f"a request with rid {r.rid!r} is already in flight")
            for r in reqs:
                self._by_rid[r.rid] = r
                self._waiting.append(r)
            self._cond.notify_all()

    def abort(self, rid: str | None = None, abort_all: bool = False) -> int:
        """Abort the live request `rid` (exact match) or every live one; returns how many were hit.

        A queued request finishes at once with "Abort in waiting queue"; a running one finishes at
        the next step boundary with its partial output.
        """
        with self._cond:
            targets = (
                list(self._by_rid.values())
                if abort_all
                else [self._by_rid[rid]]
                if rid in self._by_rid
                else []
            )
            for req in targets:
                if req.phase is Phase.WAITING and not req.prefilled and not req.output_ids:
                    self._waiting.remove(req)
                    self._finish(req, {"type": "abort", "message": "Abort in waiting queue"})
                else:
                    req.abort_requested = True
            self._cond.notify_all()
            return len(targets)

    # -- pause / resume / flush -------------------------------------------------------------------

    async def pause(self, mode: str = "abort") -> None:
        """Pause generation ("abort", "retract" or "in_place"); returns once the loop is parked."""
        if mode not in ("abort", "retract", "in_place"):
            raise ValueError(f"unknown pause mode {mode!r}: expected abort, retract or in_place")
        with self._cond:
            self._paused = True
            if mode == "retract":
                self._retract_requested = True
            self._cond.notify_all()
        if mode == "abort":
            self.abort(abort_all=True)
        await asyncio.to_thread(self._wait_parked, mode)

    def _wait_parked(self, mode: str) -> None:
        with self._cond:
            while self.alive and not (
                self._parked and not self._retract_requested and (mode != "abort" or not self._live_running())
            ):
                self._cond.wait(0.5)

    def _live_running(self) -> bool:
        return any(r.phase is Phase.RUNNING for r in self._by_rid.values())

    async def resume(self) -> None:
        """Continue generation after `pause`."""
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def flush_cache(self) -> bool:
        """Drop every kept KV cache; False if requests are running and the engine is not paused."""
        with self._cond:
            if not self._paused and self._live_running():
                return False
            if self._paused:
                self._flush_requested = True
                self._cond.notify_all()
                while self._flush_requested and self.alive:
                    self._cond.wait(0.5)
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
        plan = self._plan_update(named_tensors)
        with self._cond:
            self._hold_admission += 1
            self._cond.notify_all()
        try:
            await asyncio.to_thread(self._apply_when_quiet, plan, version)
        finally:
            with self._cond:
                self._hold_admission -= 1
                self._cond.notify_all()

    def _plan_update(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        targets = self._model.state_dict(keep_vars=True)
        problems: list[str] = []
        plan: list[tuple[torch.Tensor, torch.Tensor]] = []
        seen: dict[int, tuple[str, torch.Tensor]] = {}
        for name, tensor in named_tensors:
            target = targets.get(name)
            if target is None:
                problems.append(f"unknown parameter {name!r}")
                continue
            if tuple(tensor.shape) != tuple(target.shape):
                problems.append(f"{name}: shape {tuple(tensor.shape)} != model's {tuple(target.shape)}")
                continue
            if tensor.dtype != target.dtype:
                problems.append(f"{name}: dtype {tensor.dtype} != model's {target.dtype}")
                continue
            # Tied parameters (e.g. embed_tokens / lm_head) share storage: two different values for
            # one storage cannot both be applied.
            key = target.data_ptr()
            if key in seen and not torch.equal(seen[key][1], tensor):
                problems.append(
                    f"{name} is tied to {seen[key][0]} but the update gives them different values"
                )
                continue
            seen[key] = (name, tensor)
            plan.append((target, tensor))
        if problems:
            shown = "; ".join(problems[:10]) + (
                f"; and {len(problems) - 10} more" if len(problems) > 10 else ""
            )
            raise WeightUpdateError(f"weight update refused, nothing changed: {shown}")
        if not plan:
            raise WeightUpdateError("weight update refused: no tensors given")
        return plan

    def _apply_when_quiet(self, plan: list[tuple[torch.Tensor, torch.Tensor]], version: str | None) -> None:
        with self._cond:
            while not self._stopped and not self._paused and self._live_running():
                self._cond.wait(0.5)
        with self._step_lock, torch.no_grad():
            for target, tensor in plan:
                target.data.copy_(tensor)
            if version is not None:
                self._weight_version = version
        self.flush_cache()
        log.info(
            "weights updated",
            extra={"fields": {"weight_version": self._weight_version, "tensors": len(plan)}},
        )

    async def load_weights_from_dir(self, path: Path, version: str | None) -> int:
        """Apply a safetensors checkpoint directory to the live model; returns the tensor count."""
        tensors = await asyncio.to_thread(read_safetensors_dir, Path(path))
        await self.update_weights(tensors.items(), version)
        return len(tensors)

    # -- lifecycle --------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Abort everything and stop the step loop."""
        self.abort(abort_all=True)
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    # -- the step loop (engine thread) ------------------------------------------------------------

    def _loop(self) -> None:
        torch.set_num_threads(self.config.threads)
        while True:
            with self._cond:
                if not self._schedule():
                    return
            try:
                with self._step_lock, torch.inference_mode():
                    self._step()
            except Exception as exc:  # a model/runtime failure must not leave callers hanging
                log.exception("engine step failed")
                self._fail_all(exc)

    def _schedule(self) -> bool:
        """Under the lock: wait for work, apply control requests, admit; False once stopped."""
        while not self._stopped:
            self._apply_control()
            if not self._paused:
                self._admit()
                if self._prefilling or self._batch:
                    return True
            self._parked = True
            self._cond.notify_all()
            self._cond.wait()
            self._parked = False
        return False

    def _admit(self) -> None:
        while (
            self._waiting
            and not self._hold_admission
            and len(self._batch) + len(self._prefilling) < self.config.max_running
        ):
            req = self._waiting.popleft()
            req.phase = Phase.RUNNING
            self._prefilling.append(req)

    def _apply_control(self) -> None:
        """Aborts, retraction and cache flushes, applied between steps (lock held)."""
        rows = [i for i, r in enumerate(self._batch.reqs) if not r.abort_requested]
        for r in self._batch.reqs:
            if r.abort_requested:
                self._finish(r, _aborted())
        for r in list(self._waiting):
            if r.abort_requested:
                self._waiting.remove(r)
                self._finish(r, _aborted())
        self._batch.keep(rows)
        for r in [r for r in self._prefilling if r.abort_requested]:
            self._prefilling.remove(r)
            self._finish(r, _aborted())
        if self._retract_requested or self._flush_requested:
            # Running requests go back to the front of the queue, in order, without their KV.
            for r in reversed(self._batch.reqs + self._prefilling):
                r.phase = Phase.WAITING
                r.kv, r.prefill_done = None, 0
                if self._retract_requested:
                    r.num_retractions += 1
                self._waiting.appendleft(r)
            self._batch = BatchCache()
            self._prefilling = []
            self._retract_requested = False
            self._flush_requested = False
            self._cond.notify_all()

    def _step(self) -> None:
        """One loop iteration: up to `chunked_prefill_size` prompt tokens of prefill, then a decode step."""
        budget = self.config.chunked_prefill_size
        while self._prefilling and budget > 0:
            req = self._prefilling[0]
            budget -= self._prefill_chunk(req, budget)
            if req.kv is not None and req.prefill_done == 0:  # prefill complete
                self._prefilling.pop(0)
                if req.phase is Phase.RUNNING:
                    self._batch.add(req)
            elif req.phase is Phase.FINISHED:
                self._prefilling.pop(0)
        if self._batch:
            self._decode()

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor | None, pos: torch.Tensor, cache
    ) -> torch.Tensor:
        kwargs = {self._cache_kwarg: cache}
        out = self._base(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **kwargs)
        return out.last_hidden_state

    def _prefill_chunk(self, req: Request, budget: int) -> int:
        """Feed up to `budget` more tokens of `req`'s sequence into its own KV cache.

        A fresh request's sequence is its prompt; once complete, its prompt logprobs are done and
        its first token is sampled. A retracted request re-feeds prompt + output except the last
        output id, which the next decode step feeds. Returns the number of tokens fed; on
        completion `prefill_done` is reset to 0 (the request then leaves the prefill list).
        """
        if req.abort_requested:
            self._finish(req, _aborted())
            return 0
        fresh = not req.output_ids
        seq = req.input_ids if fresh else req.input_ids + req.output_ids[:-1]
        lo = req.prefill_done
        hi = min(len(seq), lo + budget)
        if req.kv is None:
            req.kv = new_cache()
        ids = torch.tensor([seq[lo:hi]], dtype=torch.long)
        hidden = self._forward(ids, None, torch.arange(lo, hi).unsqueeze(0), req.kv)
        if fresh and req.return_logprob and req.logprob_start_len >= 0:
            self._prompt_logprobs(req, hidden[0], lo)
        if hi < len(seq):
            req.prefill_done = hi
            return hi - lo
        req.prefill_done = 0
        if fresh:
            req.prefilled = True
            if req.params.max_new_tokens == 0:
                self._finish(req, {"type": "length", "length": 0})
                return hi - lo
            logits = self._lm_head(hidden[:, -1]).float()
            self._sample_and_advance([req], logits)
        return hi - lo

    def _prompt_logprobs(self, req: Request, hidden: torch.Tensor, lo: int) -> None:
        """Teacher-forced logprobs of prompt tokens from `logprob_start_len` (first entry null).

        `hidden` holds positions `lo ..`; position p's hidden state scores prompt token p + 1.
        """
        start = req.logprob_start_len
        if lo == 0:
            req.input_logprobs = [None]
            req.input_top_logprobs = [None]
        first = max(lo, start)
        end = min(lo + hidden.shape[0], len(req.input_ids) - 1)
        k = req.top_logprobs_num
        for p0 in range(first, end, LOGIT_CHUNK):
            p1 = min(p0 + LOGIT_CHUNK, end)
            lp = scaled_logprobs(
                self._lm_head(hidden[p0 - lo : p1 - lo]).float(), req.params, self.config.original_logprob
            )
            tgt = torch.tensor(req.input_ids[p0 + 1 : p1 + 1], dtype=torch.long)
            req.input_logprobs.extend(lp.gather(1, tgt.unsqueeze(1)).squeeze(1).tolist())
            if k > 0:
                vals, idx = lp.topk(k, dim=1)
                req.input_top_logprobs.extend(
                    list(zip(v, i, strict=True)) for v, i in zip(vals.tolist(), idx.tolist(), strict=True)
                )

    def _decode(self) -> None:
        batch = self._batch
        ids = torch.tensor([[r.output_ids[-1]] for r in batch.reqs], dtype=torch.long)
        pos = torch.tensor([[r.seq_len - 1] for r in batch.reqs], dtype=torch.long)
        batch.mask = torch.cat([batch.mask, torch.ones((len(batch), 1), dtype=torch.long)], dim=1)
        # Without padding the mask is all ones: let the model take its plain causal path.
        hidden = self._forward(ids, batch.mask if batch.padded else None, pos, batch.cache)
        logits = self._lm_head(hidden[:, -1]).float()
        self._sample_and_advance(batch.reqs, logits)
        keep = [i for i, r in enumerate(batch.reqs) if r.phase is Phase.RUNNING]
        with self._cond:
            batch.keep(keep)

    def _sample_and_advance(self, reqs: list[Request], logits: torch.Tensor) -> None:
        rows = []
        for r in reqs:
            suppress = None
            if len(r.output_ids) < r.params.min_new_tokens:
                suppress = self._stop_ids(r)
            rows.append(SamplerRow(r.params, r.generator, r.output_ids, suppress))
        need_lp = [i for i, r in enumerate(reqs) if r.return_logprob]
        ids, logprobs = sample(logits, rows, self.config.original_logprob, need_logprobs=bool(need_lp))
        chosen = (
            logprobs[torch.tensor(need_lp), torch.tensor([ids[i] for i in need_lp])].tolist()
            if need_lp
            else []
        )
        max_k = max((r.top_logprobs_num for r in reqs if r.return_logprob), default=0)
        top = logprobs.topk(max_k, dim=1) if max_k > 0 else None
        top_vals = top.values.tolist() if top is not None else None
        top_idx = top.indices.tolist() if top is not None else None
        for j, i in enumerate(need_lp):
            r = reqs[i]
            r.output_logprobs.append(chosen[j])
            if r.top_logprobs_num > 0 and top_vals is not None:
                k = r.top_logprobs_num
                r.output_top_logprobs.append(list(zip(top_vals[i][:k], top_idx[i][:k], strict=True)))
        for i, r in enumerate(reqs):
            r.output_ids.append(ids[i])
            self._check_finished(r)

    def _stop_ids(self, r: Request) -> list[int]:
        stop = list(r.params.stop_token_ids)
        if not r.params.ignore_eos:
            stop.extend(self.eos_ids)
        return stop

    def _check_finished(self, r: Request) -> None:
        tok = r.output_ids[-1]
        n = len(r.output_ids)
        p = r.params
        reason = None
        if n >= p.min_new_tokens and ((tok in self.eos_ids and not p.ignore_eos) or tok in p.stop_token_ids):
            reason = {"type": "stop", "matched": tok}
        elif p.stop and n >= p.min_new_tokens and (matched := self._match_stop_string(r)) is not None:
            reason = {"type": "stop", "matched": matched}
        elif n >= p.max_new_tokens:
            reason = {"type": "length", "length": p.max_new_tokens}
        elif self.max_context_length is not None and r.seq_len >= self.max_context_length:
            reason = {"type": "length", "length": n}
        if reason is not None:
            self._finish(r, reason)
        elif r.stream and n - r.last_emit >= (p.stream_interval or 1):
            r.last_emit = n
            r.sink(self._snapshot(r))

    def _match_stop_string(self, r: Request) -> str | None:
        longest = max(len(s) for s in r.params.stop)
        # Every token decodes to at least one character except partial UTF-8 bytes: a tail of
        # `longest + 4` tokens covers the longest stop string.
        tail = self._tokenizer.decode(
            r.output_ids[-(longest + 4) :], skip_special_tokens=r.params.skip_special_tokens
        )
        for s in r.params.stop:
            if s in tail:
                return s
        return None

    def _text(self, r: Request, final: bool) -> str:
        ids = r.output_ids
        reason = r.finish_reason or {}
        trim = final and reason.get("type") == "stop" and not r.params.no_stop_trim
        if trim and isinstance(reason.get("matched"), int):
            ids = ids[:-1]
        text = self._tokenizer.decode(ids, skip_special_tokens=r.params.skip_special_tokens)
        if trim and isinstance(reason.get("matched"), str):
            cut = text.find(reason["matched"])
            if cut >= 0:
                text = text[:cut]
        if not final:
            # Hold back an incomplete UTF-8 sequence until its remaining bytes arrive.
            text = text.rstrip("\ufffd")
        return text

    def _snapshot(self, r: Request) -> Update:
        final = r.phase is Phase.FINISHED
        return Update(
            n_out=len(r.output_ids),
            text=self._text(r, final),
            finish_reason=r.finish_reason,
            weight_version=self._weight_version,
            e2e_latency=(time.monotonic() - r.created) if final else None,
        )

    def _finish(self, r: Request, reason: dict) -> None:
        """Mark `r` finished and deliver its final update."""
        with self._cond:  # re-entrant: callers may already hold it
            if r.phase is Phase.FINISHED:
                return
            r.phase = Phase.FINISHED
            r.finish_reason = reason
            r.kv = None
            self._by_rid.pop(r.rid, None)
            try:
                r.sink(self._snapshot(r))
            except Exception:
                log.exception("request sink failed", extra={"fields": {"rid": r.rid}})
            self._cond.notify_all()

    def _fail_all(self, exc: Exception) -> None:
        with self._cond:
            reason = {
                "type": "abort",
                "message": f"engine error: {exc}",
                "status_code": 500,
                "err_type": "InternalServerError",
            }
            for r in list(self._by_rid.values()):
                if r in self._waiting:
                    continue
                self._finish(r, reason)
            self._batch = BatchCache()
            self._prefilling = []


def _aborted() -> dict:
    return {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


def new_rid() -> str:
    """A fresh request id (uuid hex, as SGLang mints them)."""
    return uuid.uuid4().hex


def _eos_ids(model, tokenizer) -> list[int]:
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, (list, tuple)):
        ids.update(int(e) for e in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)


def _check_supported(model) -> None:
    """Refuse models whose logits are not a plain `lm_head(final hidden state)`."""
    cfg = model.config
    for attr in ("final_logit_softcapping", "logit_scale"):
        if getattr(cfg, attr, None) not in (None, 1.0):
            raise EngineError(f"models with {attr} are not supported by the embedded engine")
    if model.get_output_embeddings() is None:
        raise EngineError("the model has no output embeddings (lm_head): not a causal LM")


def read_safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors checkpoint directory (single file, several, or index-sharded)."""
    import orjson
    from safetensors.torch import load_file

    if not path.is_dir():
        raise WeightUpdateError(f"checkpoint directory {path} does not exist")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = orjson.loads(index.read_bytes()).get("weight_map", {})
        files = sorted({path / f for f in weight_map.values()})
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightUpdateError(f"no safetensors files in {path}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        if not f.is_file():
            raise WeightUpdateError(f"checkpoint shard {f} is missing")
        tensors.update(load_file(str(f)))
    return tensors
