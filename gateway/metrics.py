"""The gateway's Prometheus metrics: one registry, the metric objects, and the request meter.

Every metric the gateway exports is defined here, once, with its meaning in its help text;
other modules import the object and update it (`SEGMENTS.labels(cause).inc()`). All updates
are O(1) and never await. Metrics whose value is a view of live state (open sessions per
tenant) are computed at scrape time by a collector (`OpenSessionsCollector`), so turns pay
nothing for them. This module owns no HTTP route (`ops/api.py` serves `/metrics`) and no
middleware: the gateway's edge (`serving/edge.py`) calls `start_request`/`finish_request`.

Names (all prefixed `rlgw_`):

| metric | type | labels | meaning |
| --- | --- | --- | --- |
| `requests_total` | counter | route, method, status | HTTP requests answered, by route template |
| `request_seconds` | histogram | route | wall time from request to the last body byte |
| `turn_added_seconds` | histogram | surface | a turn's time minus the engine's time: what rlgw adds |
| `engine_seconds` | histogram | — | time spent waiting on the engine per turn |
| `recorded_tokens_total` | counter | — | tokens appended to ledgers (prompt increments + sampled) |
| `trainable_tokens_total` | counter | — | sampled tokens recorded with loss mask 1 |
| `generated_tokens_total` | counter | — | tokens the engine sampled for agents (recorded or not) |
| `segments_total` | counter | cause | ledger segments opened, by machine-readable cause |
| `conversations_total` | counter | — | conversations in finished capture sessions (subagents, side calls) |
| `sample_rejects_total` | counter | reason | segments refused at finish, by the sample contract's reason |
| `request_rejects_total` | counter | reason | requests refused before a turn: limits, body caps, auth |
| `engine_errors_total` | counter | kind | failed engine calls (overloaded, timeout, aborted, upstream) |
| `journal_write_seconds` | histogram | — | time to make one turn's journal record durable |
| `open_sessions` | gauge | tenant | sessions open (not finished) on this process, per tenant |
| `turns_in_flight` | gauge | — | turns running now (what a graceful shutdown waits for) |
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from rlgw.gateway.errors import UpstreamError

# One registry per process (Prometheus' model: a scrape describes the process). It is not the
# library's global default, so importing rlgw never adds metrics to a host application's.
REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

# Turn latencies are sub-millisecond to minutes: buckets from 0.25 ms up.
_FAST = (0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_SLOW = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

REQUESTS = Counter(
    "rlgw_requests", "HTTP requests answered, by route template, method and status.",
    ("route", "method", "status"), registry=REGISTRY,
)  # fmt: skip
REQUEST_SECONDS = Histogram(
    "rlgw_request_seconds", "Wall time of an HTTP request, from its start to its last body byte.",
    ("route",), buckets=_SLOW, registry=REGISTRY,
)  # fmt: skip
TURN_ADDED_SECONDS = Histogram(
    "rlgw_turn_added_seconds",
    "The gateway's own time per turn: the request's wall time minus the time spent waiting on the engine.",
    ("surface",), buckets=_FAST, registry=REGISTRY,
)  # fmt: skip
ENGINE_SECONDS = Histogram(
    "rlgw_engine_seconds", "Time a turn spent waiting on the engine (all its engine calls).",
    buckets=_SLOW, registry=REGISTRY,
)  # fmt: skip
RECORDED_TOKENS = Counter(
    "rlgw_recorded_tokens", "Tokens appended to session ledgers: prompt increments plus sampled tokens.",
    registry=REGISTRY,
)  # fmt: skip
TRAINABLE_TOKENS = Counter(
    "rlgw_trainable_tokens", "Sampled tokens recorded with loss mask 1 (what training learns from).",
    registry=REGISTRY,
)  # fmt: skip
GENERATED_TOKENS = Counter(
    "rlgw_generated_tokens", "Tokens the engine sampled for agents, recorded or not (eval, passthrough).",
    registry=REGISTRY,
)  # fmt: skip
SEGMENTS = Counter(
    "rlgw_segments", "Ledger segments opened after a history change, by machine-readable cause.",
    ("cause",), registry=REGISTRY,
)  # fmt: skip
CONVERSATIONS = Counter(
    "rlgw_conversations",
    "Conversations in finished capture sessions: a main agent, its subagents and side calls (title, memory).",
    registry=REGISTRY,
)  # fmt: skip
SAMPLE_REJECTS = Counter(
    "rlgw_sample_rejects", "Segments refused at finish by the sample contract, by reason code.",
    ("reason",), registry=REGISTRY,
)  # fmt: skip
REQUEST_REJECTS = Counter(
    "rlgw_request_rejects",
    "Requests refused before a turn ran: a tenant limit (429) or a body or size cap (413/400).",
    ("reason",), registry=REGISTRY,
)  # fmt: skip
ENGINE_ERRORS = Counter(
    "rlgw_engine_errors", "Turns failed by the engine, by kind (overloaded, timeout, aborted, upstream).",
    ("kind",), registry=REGISTRY,
)  # fmt: skip
JOURNAL_WRITE_SECONDS = Histogram(
    "rlgw_journal_write_seconds", "Time to make one committed turn's journal record durable.",
    buckets=_FAST, registry=REGISTRY,
)  # fmt: skip
TURNS_IN_FLIGHT = Gauge(
    "rlgw_turns_in_flight", "Turns running now (a graceful shutdown waits for them).", registry=REGISTRY
)


class RequestClock:
    """Per-request timing shared between the meter and the code under it.

    The engine client adds its waiting time with `add_engine_time`; a turn names its surface
    with `mark_turn`. The meter then splits the request's wall time into engine time and the
    gateway's own.
    """

    __slots__ = ("engine_s", "surface")

    def __init__(self) -> None:
        self.engine_s = 0.0
        self.surface: str | None = None


_CLOCK: contextvars.ContextVar[RequestClock | None] = contextvars.ContextVar(
    "rlgw_request_clock", default=None
)


def add_engine_time(seconds: float) -> None:
    """Count `seconds` spent waiting on the engine against the current request (if metered)."""
    clock = _CLOCK.get()
    if clock is not None:
        clock.engine_s += seconds


def mark_turn(surface: str) -> None:
    """Say that the current request is a turn on `surface` (chat, completions, messages, ...)."""
    clock = _CLOCK.get()
    if clock is not None:
        clock.surface = surface


def turn_recorded(recorded: int, trainable: int) -> None:
    """A committed turn appended `recorded` tokens to its ledger, `trainable` of them with mask 1."""
    RECORDED_TOKENS.inc(recorded)
    TRAINABLE_TOKENS.inc(trainable)


def engine_error(kind: str) -> None:
    """Count one failed engine call of `kind` (an error code such as `engine_timeout`)."""
    ENGINE_ERRORS.labels(kind).inc()


class TurnInFlight:
    """A running turn, as a context manager: counted in the in-flight gauge, and on the way out
    an engine failure counted by kind. One instance serves every turn (it holds nothing)."""

    __slots__ = ()

    def __enter__(self) -> TurnInFlight:
        TURNS_IN_FLIGHT.inc()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        TURNS_IN_FLIGHT.dec()
        if isinstance(exc, UpstreamError):
            engine_error(exc.code or exc.type)


TURN_IN_FLIGHT = TurnInFlight()


def turn_generated(surface: str, generated: int) -> None:
    """A committed turn on `surface` generated `generated` tokens; its request is metered as a
    turn (its added time, by surface)."""
    GENERATED_TOKENS.inc(generated)
    mark_turn(surface)


def reject(reason: str) -> None:
    """Count one request refused for `reason` (`open_sessions`, `body_too_large`, ...)."""
    REQUEST_REJECTS.labels(reason).inc()


class MeteredBackend:
    """A `ModelBackend` that counts the time spent waiting on the engine against the request.

    `generate` is timed whole; a stream is timed while waiting for each update, so the work the
    gateway does between updates stays its own. Everything else is the wrapped backend's.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def generate(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped `generate`, timed."""
        start = time.perf_counter()
        try:
            return await self._inner.generate(*args, **kwargs)
        finally:
            add_engine_time(time.perf_counter() - start)

    async def stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        """The wrapped `stream`, each wait for an update timed; closing it closes the inner one."""
        updates = self._inner.stream(*args, **kwargs)
        try:
            while True:
                start = time.perf_counter()
                try:
                    update = await updates.__anext__()
                except StopAsyncIteration:
                    return
                finally:
                    add_engine_time(time.perf_counter() - start)
                yield update
        finally:
            await updates.aclose()


def route_of(scope: dict[str, Any]) -> str:
    """The metrics label of a request: its route template, never the raw path (session ids in
    paths would make a series per session)."""
    route = scope.get("route")
    return getattr(route, "path", None) or "unmatched"


# Label children resolved once: `.labels()` takes a lock and builds a key on every call. Both
# maps are bounded by the routes and surfaces the app has (paths are labelled by template).
_METHODS = frozenset(("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"))
_REQUEST_CHILDREN: dict[tuple[str, str, int], tuple[Any, Any]] = {}
_ADDED_CHILDREN: dict[str, Any] = {}


def start_request() -> tuple[RequestClock, contextvars.Token[RequestClock | None]]:
    """Start timing a request: the clock that engine waits and `mark_turn` report to."""
    clock = RequestClock()
    return clock, _CLOCK.set(clock)


def finish_request(
    token: contextvars.Token[RequestClock | None],
    clock: RequestClock,
    route: str,
    method: str,
    status: int,
    elapsed: float,
) -> None:
    """Count and time one answered request; a turn's wall time minus its engine time is the
    gateway's added time."""
    _CLOCK.reset(token)
    method = method if method in _METHODS else "other"
    key = (route, method, status)
    children = _REQUEST_CHILDREN.get(key)
    if children is None:
        children = _REQUEST_CHILDREN[key] = (
            REQUESTS.labels(route, method, str(status)),
            REQUEST_SECONDS.labels(route),
        )
    children[0].inc()
    children[1].observe(elapsed)
    if clock.surface is not None:
        ENGINE_SECONDS.observe(clock.engine_s)
        added = _ADDED_CHILDREN.get(clock.surface)
        if added is None:
            added = _ADDED_CHILDREN[clock.surface] = TURN_ADDED_SECONDS.labels(clock.surface)
        added.observe(max(0.0, elapsed - clock.engine_s))


class OpenSessionsCollector(Collector):
    """`rlgw_open_sessions{tenant}` from a per-tenant count taken at scrape time."""

    def __init__(self, counts: dict[str, int]) -> None:
        self._counts = counts

    def collect(self) -> Iterable[GaugeMetricFamily]:
        """One gauge sample per tenant with open sessions."""
        family = GaugeMetricFamily(
            "rlgw_open_sessions",
            "Sessions open (not finished) on this process, per tenant.",
            labels=["tenant"],
        )
        for tenant, n in sorted(self._counts.items()):
            family.add_metric([tenant], n)
        yield family


def exposition(open_sessions: dict[str, int] | None = None) -> tuple[bytes, str]:
    """The process registry and the open-session counts in Prometheus' text format.

    Safe to run off the event loop: `open_sessions` is a snapshot taken on it.
    """
    live = CollectorRegistry(auto_describe=True)
    live.register(OpenSessionsCollector(open_sessions or {}))
    return generate_latest(REGISTRY) + generate_latest(live), CONTENT_TYPE_LATEST
