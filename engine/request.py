"""One generation request, its phases, and the snapshots it delivers.

Owns the `Request` record (what the caller asked for, and what the engine filled in so far), its
`Phase`, the `Update` snapshots handed to its sink, and SGLang's finish-reason shapes. Knows nothing
about queues, locks, models or HTTP: the scheduler moves a request between phases, the runner fills
its outputs, the server renders them.

Phases: WAITING (queued; also a retracted request waiting to be re-prefilled) -> RUNNING (being
prefilled or in the decode batch) -> FINISHED (final update delivered; never left).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import torch

from rlgw.engine.grammar import Matcher
from rlgw.engine.sampling import SamplingParams, make_generator


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
    grammar: Matcher | None = None  # json_schema / regex / ebnf / structural_tag, compiled
    return_routed_experts: bool = False
    routed_experts_start_len: int = 0  # routing rows cover positions [this, seqlen - 1)
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
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    cache_epoch: int = 0  # the prefix cache's epoch when this request's KV computation began
    last_emit: int = 0
    # Routing rows in order, int32 [rows, layers, top_k] chunks (`rlgw.engine.routing`).
    routed_experts: list[torch.Tensor] = field(default_factory=list)
    routed_rows: int = 0

    def __post_init__(self) -> None:
        self.generator = make_generator(self.params.sampling_seed)

    @property
    def seq_len(self) -> int:
        """Tokens in the sequence so far (prompt + output; the last output id is not yet in the cache)."""
        return len(self.input_ids) + len(self.output_ids)

    @property
    def untouched(self) -> bool:
        """True while nothing was computed for it (a queued request that can be dropped at once)."""
        return self.phase is Phase.WAITING and not self.prefilled and not self.output_ids

    def stream_due(self) -> bool:
        """True (and the emit mark moved) when a streaming request has `stream_interval` new tokens."""
        n = len(self.output_ids)
        if not self.stream or n - self.last_emit < (self.params.stream_interval or 1):
            return False
        self.last_emit = n
        return True


def new_rid() -> str:
    """A fresh request id (uuid hex, as SGLang mints them)."""
    return uuid.uuid4().hex


# SGLang's finish reasons (`schedule_batch.py`'s FINISH_* `to_json`).


def stopped(matched: int | str) -> dict:
    """Finished on a stop token id or a stop string."""
    return {"type": "stop", "matched": matched}


def length(n: int) -> dict:
    """Finished at a length limit (`max_new_tokens`, or the context for a shorter count)."""
    return {"type": "length", "length": n}


def aborted() -> dict:
    """Aborted while running (by the client, `/abort_request` or a pause)."""
    return {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


def aborted_waiting() -> dict:
    """Aborted before it left the waiting queue (its meta_info lacks the prompt counts)."""
    return {"type": "abort", "message": "Abort in waiting queue"}


def failed(message: str, status: int, err_type: str) -> dict:
    """Finished by an error; a 4xx/5xx `status_code` makes a non-streamed reply fail with it."""
    return {"type": "abort", "message": message, "status_code": status, "err_type": err_type}
