"""The scheduler: who runs next. Queue, admission, pause/retract/flush, aborts; it owns the lock.

Owns every piece of shared request state and the one `threading.Condition` that guards it: the
bounded waiting queue, the requests being prefilled, the running batch's membership, the rid index,
the pause and admission-hold flags, and the delivery of final updates (`finish`). Callers on any
thread submit, abort, pause and resume here; the engine thread asks `next_step()` for permission to
compute and holds `step_lock` while it does. Knows nothing about models, tensors' contents or HTTP:
the runner computes, `Engine` (`rlgw.engine.core`) wires the two together.

Pause modes (SGLang's): "abort" aborts everything and waits for it to drain; "retract" moves running
requests back to the front of the queue without their KV (re-prefilled from prompt + output so far);
"in_place" freezes the step loop with the KV kept. New requests queue up while paused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator

from rlgw.engine.batch import BatchCache
from rlgw.engine.errors import QueueFullError, RequestError
from rlgw.engine.request import Phase, Request, Update, aborted, aborted_waiting, failed

log = logging.getLogger(__name__)

PAUSE_MODES = ("abort", "retract", "in_place")


class Scheduler:
    """Request state behind one lock, and the rules for admitting, pausing and ending requests.

    `snapshot(request)` builds the final `Update` that `finish` delivers to a request's sink.
    """

    def __init__(self, max_queue: int, max_running: int, snapshot: Callable[[Request], Update]) -> None:
        self.max_queue = max_queue
        self.max_running = max_running
        self._snapshot = snapshot
        self.cond = threading.Condition()  # re-entrant: `finish` may run with it already held
        self.step_lock = threading.Lock()  # held by the engine thread for every compute step
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []  # admitted, prefill in progress (engine thread only)
        self.batch = BatchCache()  # decoding requests and their shared KV
        self._by_rid: dict[str, Request] = {}
        self.paused = False
        self._hold_admission = 0  # >0 while a weight update waits for running requests to drain
        self._retract_requested = False
        self._flush_requested = False
        self._parked = False  # the loop is waiting on the condition, between steps
        self.stopped = False

    def load_stats(self) -> dict[str, int]:
        """Queue and batch sizes."""
        with self.cond:
            return {"num_waiting": len(self.waiting), "num_running": int(self._live_running())}

    def _live_running(self) -> int:
        return sum(1 for r in self._by_rid.values() if r.phase is Phase.RUNNING)

    # -- submission and abort ----------------------------------------------------------------------

    def submit(self, reqs: list[Request]) -> None:
        """Queue `reqs` together, or none of them (`QueueFullError` when the queue lacks room).

        A request that arrives already finished (a constraint that did not compile) is delivered at
        once without being queued, as SGLang's scheduler does with `set_finish_with_abort`.
        """
        with self.cond:
            queued = [r for r in reqs if r.finish_reason is None]
            if len(self.waiting) + len(queued) > self.max_queue:
                raise QueueFullError(
                    f"The engine's waiting queue is full ({len(self.waiting)}/{self.max_queue} "
                    f"requests waiting); retry later or start the engine with a larger --max-queue."
                )
            for r in reqs:
                if r.rid in self._by_rid:
                    raise RequestError(f"a request with rid {r.rid!r} is already in flight")
            for r in reqs:
                self._by_rid[r.rid] = r
                if r.finish_reason is None:
                    self.waiting.append(r)
                else:
                    self.finish(r, r.finish_reason)
            self.cond.notify_all()

    def abort(self, rid: str | None = None, abort_all: bool = False) -> int:
        """Abort the live request `rid` (exact match) or every live one; returns how many were hit.

        A queued request finishes at once with "Abort in waiting queue"; a running one finishes at
        the next step boundary with its partial output.
        """
        with self.cond:
            if abort_all:
                targets = list(self._by_rid.values())
            else:
                targets = [self._by_rid[rid]] if rid in self._by_rid else []
            for req in targets:
                if req.untouched:
                    self.waiting.remove(req)
                    self.finish(req, aborted_waiting())
                else:
                    req.abort_requested = True
            self.cond.notify_all()
            return len(targets)

    # -- pause / resume / flush / admission hold -----------------------------------------------------

    async def pause(self, mode: str = "abort") -> None:
        """Pause generation ("abort", "retract" or "in_place"); returns once the loop is parked."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"unknown pause mode {mode!r}: expected abort, retract or in_place")
        with self.cond:
            self.paused = True
            if mode == "retract":
                self._retract_requested = True
            self.cond.notify_all()
        if mode == "abort":
            self.abort(abort_all=True)
        await asyncio.to_thread(self._wait_parked, mode)

    def _wait_parked(self, mode: str) -> None:
        with self.cond:
            while not self.stopped and not (
                self._parked and not self._retract_requested and (mode != "abort" or not self._live_running())
            ):
                self.cond.wait(0.5)

    async def resume(self) -> None:
        """Continue generation after `pause`."""
        with self.cond:
            self.paused = False
            self.cond.notify_all()

    def flush_cache(self) -> bool:
        """Drop every kept KV cache; False if requests are running and the engine is not paused."""
        with self.cond:
            if not self.paused and self._live_running():
                return False
            if self.paused:
                self._flush_requested = True
                self.cond.notify_all()
                while self._flush_requested and not self.stopped:
                    self.cond.wait(0.5)
            return True

    @contextlib.contextmanager
    def admission_held(self) -> Iterator[None]:
        """New requests wait in the queue while this is held (a weight update is pending)."""
        with self.cond:
            self._hold_admission += 1
            self.cond.notify_all()
        try:
            yield
        finally:
            with self.cond:
                self._hold_admission -= 1
                self.cond.notify_all()

    def wait_quiet(self) -> None:
        """Block until no request is running, or the engine is paused or stopped."""
        with self.cond:
            while not self.stopped and not self.paused and self._live_running():
                self.cond.wait(0.5)

    # -- the engine thread's side ------------------------------------------------------------------

    def next_step(self) -> bool:
        """Wait for work, apply aborts/retraction/flushes, admit; False once stopped."""
        with self.cond:
            while not self.stopped:
                self._apply_control()
                if not self.paused:
                    self._admit()
                    if self.prefilling or self.batch:
                        return True
                self._parked = True
                self.cond.notify_all()
                self.cond.wait()
                self._parked = False
            return False

    def _admit(self) -> None:
        while (
            self.waiting
            and not self._hold_admission
            and len(self.batch) + len(self.prefilling) < self.max_running
        ):
            req = self.waiting.popleft()
            req.phase = Phase.RUNNING
            self.prefilling.append(req)

    def _apply_control(self) -> None:
        """Aborts, retraction and cache flushes, applied between steps (lock held)."""
        rows = [i for i, r in enumerate(self.batch.reqs) if not r.abort_requested]
        for r in self.batch.reqs:
            if r.abort_requested:
                self.finish(r, aborted())
        for r in list(self.waiting):
            if r.abort_requested:
                self.waiting.remove(r)
                self.finish(r, aborted())
        self.batch.keep(rows)
        for r in [r for r in self.prefilling if r.abort_requested]:
            self.prefilling.remove(r)
            self.finish(r, aborted())
        if self._retract_requested or self._flush_requested:
            # Running requests go back to the front of the queue, in order, without their KV.
            for r in reversed(self.batch.reqs + self.prefilling):
                r.phase = Phase.WAITING
                r.kv, r.prefill_done = None, 0
                if self._retract_requested:
                    r.num_retractions += 1
                self.waiting.appendleft(r)
            self.batch = BatchCache()
            self.prefilling = []
            self._retract_requested = False
            self._flush_requested = False
            self.cond.notify_all()

    def drop_finished(self) -> None:
        """Remove finished rows from the running batch (after a decode step)."""
        with self.cond:
            self.batch.keep([i for i, r in enumerate(self.batch.reqs) if r.phase is Phase.RUNNING])

    def finish(self, r: Request, reason: dict) -> None:
        """Mark `r` finished and deliver its final update (once)."""
        with self.cond:
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
            self.cond.notify_all()

    def fail_all(self, exc: Exception) -> None:
        """A compute step failed: end every admitted request with a 500 abort (queued ones stay)."""
        reason = failed(f"engine error: {exc}", 500, "InternalServerError")
        with self.cond:
            for r in list(self._by_rid.values()):
                if r in self.waiting:
                    continue
                self.finish(r, reason)
            self.batch = BatchCache()
            self.prefilling = []

    def stop(self) -> None:
        """Abort everything and let the step loop return."""
        self.abort(abort_all=True)
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
