"""Per-tenant limits: open sessions, requests in flight, generated tokens per minute.

Over a limit the answer is 429 in OpenAI's error format with a `Retry-After` header
(`RateLimited`). Each check and update is O(1) (open sessions: O(the tenant's own open
sessions) at session creation only) and none holds anything across an await: the in-flight
count is a plain integer, the token window a ring of one-second buckets.

Tokens are counted when a turn commits (a generation's length is not known before it runs),
so the per-minute limit refuses the turn after the one that crossed it, as OpenAI's does.

A turn reaches its app's `LimitTable` through a context variable that the gateway's edge
binds per request (`bind`): the turn lifecycle (`turn.turn_scope`) only sees the session, and code
that runs outside a request (unit tests of a turn) is simply not limited. This module knows
tenants only by name; who a caller is belongs to `tenants`.
"""

from __future__ import annotations

import contextvars
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from rlgw.gateway import metrics
from rlgw.gateway.errors import APIError, NotFound

WINDOW_S = 60


@dataclass(frozen=True, slots=True)
class Limits:
    """A tenant's limits; None is unlimited."""

    open_sessions: int | None = None
    in_flight: int | None = None
    tokens_per_minute: int | None = None

    def to_dict(self) -> dict[str, int | None]:
        """The JSON form (the admin API's `limits` object)."""
        return {
            "open_sessions": self.open_sessions,
            "in_flight": self.in_flight,
            "tokens_per_minute": self.tokens_per_minute,
        }

    def over(self, base: Limits) -> Limits:
        """These limits, with `base`'s value wherever this one is None."""
        return Limits(
            open_sessions=self.open_sessions if self.open_sessions is not None else base.open_sessions,
            in_flight=self.in_flight if self.in_flight is not None else base.in_flight,
            tokens_per_minute=(
                self.tokens_per_minute if self.tokens_per_minute is not None else base.tokens_per_minute
            ),
        )


class RateLimited(APIError):
    """429: the tenant is over one of its limits; `Retry-After` says when to try again."""

    status = 429
    type = "rate_limit_exceeded"

    def __init__(self, message: str, *, code: str, retry_after: float) -> None:
        super().__init__(message, code=code)
        self.retry_after = max(1, math.ceil(retry_after))

    @property
    def headers(self) -> dict[str, str]:
        """`Retry-After` in whole seconds."""
        return {"Retry-After": str(self.retry_after)}


class TokenWindow:
    """Tokens counted over the last minute, in 60 one-second buckets (O(1) amortized)."""

    __slots__ = ("_counts", "_second", "total")

    def __init__(self) -> None:
        self._counts = [0] * WINDOW_S
        self._second = 0  # the newest second the ring holds
        self.total = 0

    def _advance(self, now_s: int) -> None:
        gap = now_s - self._second
        if gap <= 0:
            return
        if gap >= WINDOW_S:
            self._counts = [0] * WINDOW_S
            self.total = 0
        else:
            for s in range(self._second + 1, now_s + 1):
                i = s % WINDOW_S
                self.total -= self._counts[i]
                self._counts[i] = 0
        self._second = now_s

    def add(self, n: int, now: float) -> None:
        """Count `n` tokens at time `now` (seconds, monotonic)."""
        now_s = int(now)
        self._advance(now_s)
        self._counts[now_s % WINDOW_S] += n
        self.total += n

    def used(self, now: float) -> int:
        """Tokens counted in the minute up to `now`."""
        self._advance(int(now))
        return self.total

    def seconds_until_below(self, limit: int, now: float) -> float:
        """How long until the window holds fewer than `limit` tokens (if nothing more is added)."""
        now_s = int(now)
        self._advance(now_s)
        left = self.total
        for age in range(WINDOW_S - 1, -1, -1):  # oldest bucket first
            left -= self._counts[(now_s - age) % WINDOW_S]
            if left < limit:
                # That bucket leaves the window when it is WINDOW_S seconds old.
                return (now_s - age + WINDOW_S) - now
        return float(WINDOW_S)


class _Usage:
    """What one tenant uses right now."""

    __slots__ = ("in_flight", "sessions", "tokens")

    def __init__(self) -> None:
        self.in_flight = 0
        self.sessions: set[str] = set()
        self.tokens = TokenWindow()


class TurnSlot:
    """A turn's hold on its tenant's in-flight count; releases it (once) on exit."""

    __slots__ = ("_usage",)

    def __init__(self, usage: _Usage | None) -> None:
        self._usage = usage

    def __enter__(self) -> TurnSlot:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._usage is not None:
            self._usage.in_flight -= 1
            self._usage = None


class LimitTable:
    """Every tenant's limits (defaults plus per-tenant overrides) and current usage."""

    def __init__(self, default: Limits | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.default = default or Limits()
        self._overrides: dict[str, Limits] = {}
        self._usage: dict[str, _Usage] = {}
        self._clock = clock

    def set_limits(self, tenant: str, limits: Limits | None) -> None:
        """Give `tenant` its own limits (None fields fall back to the defaults); None: defaults."""
        if limits is None:
            self._overrides.pop(tenant, None)
        else:
            self._overrides[tenant] = limits

    def replace_overrides(self, overrides: dict[str, Limits]) -> None:
        """Set every tenant's own limits at once (the tenant store's view), dropping the rest."""
        self._overrides = dict(overrides)

    def limits_for(self, tenant: str) -> Limits:
        """The limits that apply to `tenant`."""
        own = self._overrides.get(tenant)
        return own.over(self.default) if own is not None else self.default

    def _usage_of(self, tenant: str) -> _Usage:
        usage = self._usage.get(tenant)
        if usage is None:
            usage = self._usage[tenant] = _Usage()
        return usage

    def check_session_room(self, tenant: str, is_open: Callable[[str], bool]) -> None:
        """Raise `RateLimited` if `tenant` may not open another session now.

        `is_open(session_id)` says whether a session counted before is still open: finished,
        deleted and expired sessions leave the count here, so no other code path has to report
        them. Call `session_opened` right after (no await in between).
        """
        usage = self._usage_of(tenant)
        cap = self.limits_for(tenant).open_sessions
        if cap is not None and len(usage.sessions) >= cap:
            usage.sessions = {sid for sid in usage.sessions if is_open(sid)}
            if len(usage.sessions) >= cap:
                metrics.reject("open_sessions")
                raise RateLimited(
                    f"Tenant {tenant!r} has {len(usage.sessions)} open sessions, its limit is {cap}: "
                    "finish or delete one first.",
                    code="too_many_open_sessions",
                    retry_after=1,
                )

    def session_opened(self, tenant: str, session_id: str) -> None:
        """Count `session_id` among `tenant`'s open sessions."""
        self._usage_of(tenant).sessions.add(session_id)

    def open_sessions(self, is_open: Callable[[str], bool]) -> dict[str, int]:
        """Open sessions per tenant (pruning closed ones); for the `rlgw_open_sessions` gauge."""
        out: dict[str, int] = {}
        for tenant, usage in self._usage.items():
            usage.sessions = {sid for sid in usage.sessions if is_open(sid)}
            if usage.sessions:
                out[tenant] = len(usage.sessions)
        return out

    def start_turn(self, tenant: str, session_id: str | None = None) -> TurnSlot:
        """Take one of `tenant`'s in-flight slots, or raise `RateLimited` (too many in flight, or
        over its tokens per minute). Release it by exiting the returned `TurnSlot`.

        `session_id` is counted among the tenant's open sessions (a set add): a session this
        process did not open itself (restored from the journal) is counted from its first turn.
        """
        usage = self._usage_of(tenant)
        limits = self.limits_for(tenant)
        if limits.in_flight is not None and usage.in_flight >= limits.in_flight:
            metrics.reject("in_flight")
            raise RateLimited(
                f"Tenant {tenant!r} has {usage.in_flight} requests in flight, "
                f"its limit is {limits.in_flight}.",
                code="too_many_requests_in_flight",
                retry_after=1,
            )
        tpm = limits.tokens_per_minute
        if tpm is not None:
            now = self._clock()
            if usage.tokens.used(now) >= tpm:
                metrics.reject("tokens_per_minute")
                raise RateLimited(
                    f"Tenant {tenant!r} generated {usage.tokens.total} tokens in the last minute, its limit "
                    f"is {tpm} per minute.",
                    code="tokens_per_minute_exceeded",
                    retry_after=usage.tokens.seconds_until_below(tpm, now),
                )
        usage.in_flight += 1
        if session_id is not None:
            usage.sessions.add(session_id)
        return TurnSlot(usage)

    def count_generated(self, tenant: str, n: int) -> None:
        """Count `n` tokens the engine generated for `tenant` (against its tokens per minute)."""
        self._usage_of(tenant).tokens.add(n, self._clock())

    def in_flight(self, tenant: str) -> int:
        """`tenant`'s turns running now."""
        usage = self._usage.get(tenant)
        return usage.in_flight if usage is not None else 0


def open_in(sessions: Any) -> Callable[[str], bool]:
    """`is_open` for `check_session_room`/`open_sessions`: whether `sessions` (a `SessionTable`)
    holds an unfinished session with this id."""

    def is_open(session_id: str) -> bool:
        try:
            return not sessions.get(session_id).finished
        except NotFound:
            return False

    return is_open


_ACTIVE: contextvars.ContextVar[LimitTable | None] = contextvars.ContextVar("rlgw_limits", default=None)


def turn_slot(tenant: str, session_id: str | None = None) -> TurnSlot:
    """Take an in-flight slot under the current app's limits (raises `RateLimited`); outside a
    request nothing is limited."""
    table = _ACTIVE.get()
    if table is None:
        return TurnSlot(None)
    return table.start_turn(tenant, session_id)


def turn_generated(tenant: str, generated: int) -> None:
    """A committed turn generated `generated` tokens: counted against the tenant's tokens per
    minute under the current app's limits (outside a request, nothing is counted)."""
    table = _ACTIVE.get()
    if table is not None:
        table.count_generated(tenant, generated)


def bind(table: LimitTable) -> contextvars.Token[LimitTable | None]:
    """Make `table` the limits of the turns the current request runs (the edge calls this per
    request); `unbind` with the returned token."""
    return _ACTIVE.set(table)


def unbind(token: contextvars.Token[LimitTable | None]) -> None:
    """Undo `bind`."""
    _ACTIVE.reset(token)
