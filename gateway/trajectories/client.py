"""Python client of the gateway for trainers and runners: sessions, and the trajectory stream.

This module owns the client side of the gateway's own HTTP API (not the OpenAI surface,
which agents reach with any OpenAI client): typed results, and the translation of HTTP
and transport failures into `GatewayClientError`s. It knows nothing of how the gateway records
or stores; it shares only the `Sample` contract.

Errors::

    GatewayClientError                  anything this client raises
    ├── GatewayConnectionError    no HTTP answer (refused, reset, timed out)
    └── GatewayHTTPError          the gateway answered 4xx/5xx (`status`, OpenAI `body`)
        ├── GatewayRequestError   4xx: the request was wrong (bad key, unknown session, ...)
        └── GatewayServerError    5xx: the gateway or its engine failed
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from rlgw.gateway.sample import Sample

# The shortest time between two polls of the trajectory stream that found nothing: a `wait` of 0
# (or a server that answers at once) would otherwise poll in a tight loop.
POLL_FLOOR = 1.0


class GatewayClientError(Exception):
    """Base of every error raised by `GatewayClient`."""


class GatewayConnectionError(GatewayClientError):
    """The gateway could not be reached or did not answer in time."""


class GatewayHTTPError(GatewayClientError):
    """The gateway answered with an error status; `body` is its OpenAI-style error object."""

    def __init__(self, status: int, message: str, body: dict[str, Any] | None, url: str) -> None:
        super().__init__(f"{status} from {url}: {message}")
        self.status = status
        self.message = message
        self.body = body
        self.url = url

    @property
    def code(self) -> str | None:
        """The error's machine-readable `code`, when the gateway gave one."""
        return (self.body or {}).get("code")


class GatewayRequestError(GatewayHTTPError):
    """A 4xx answer: fix the request (key, session id, parameters) before retrying."""


class RolloutStoredError(GatewayRequestError):
    """409 `rollout_stored`: the rollout's finish is already stored; `summary` is what it answered."""

    @property
    def summary(self) -> FinishSummary:
        """The stored finish's summary (its samples are in the stream already)."""
        return summary_from((self.body or {})["summary"])


class GatewayServerError(GatewayHTTPError):
    """A 5xx answer: the gateway or its engine failed; retrying may help."""


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A created session: agents use `base_url` + `api_key` as an OpenAI endpoint."""

    session_id: str
    base_url: str
    api_key: str
    mode: str
    rollout_id: str


@dataclass(frozen=True, slots=True)
class FinishedSegment:
    """One stored sample of a finished session."""

    cursor: int
    segment: int
    trainable_tokens: int
    response_length: int


@dataclass(frozen=True, slots=True)
class RejectedSegment:
    """A segment that failed the hand-off contract (`reason` is a `RejectReason` value)."""

    segment: int
    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class FinishSummary:
    """What `finish` stored (already durable) and what it rejected."""

    session_id: str
    samples: list[FinishedSegment]
    trainable_tokens: int
    segments: int
    rejects: list[RejectedSegment] = field(default_factory=list)
    # What the finish said (None from a gateway that predates them in the summary).
    reward: float | None = None
    status: str | None = None
    termination_reason: str | None = None


def summary_from(doc: dict[str, Any]) -> FinishSummary:
    """A finish's JSON answer as a `FinishSummary`."""
    return FinishSummary(
        session_id=doc["session_id"],
        samples=[
            FinishedSegment(
                cursor=int(s["cursor"]),
                segment=int(s["segment"]),
                trainable_tokens=int(s["trainable_tokens"]),
                response_length=int(s["response_length"]),
            )
            for s in doc.get("samples", [])
        ],
        trainable_tokens=int(doc["trainable_tokens"]),
        segments=int(doc["segments"]),
        rejects=[
            RejectedSegment(segment=int(r["segment"]), reason=r["reason"], detail=r.get("detail", ""))
            for r in doc.get("rejects", [])
        ],
        reward=doc.get("reward"),
        status=doc.get("status"),
        termination_reason=doc.get("termination_reason"),
    )


@dataclass(frozen=True, slots=True)
class StoredTrajectory:
    """One sample from the trajectory stream, with where it sits in the stream."""

    cursor: int
    session_id: str
    task_id: str
    segment: int
    created_at: float
    sample: Sample


def _parse_trajectory(line: bytes | str) -> StoredTrajectory:
    doc = orjson.loads(line)
    return StoredTrajectory(
        cursor=int(doc.pop("cursor")),
        session_id=doc.pop("session_id"),
        task_id=doc.pop("task_id"),
        segment=int(doc.pop("segment")),
        created_at=float(doc.pop("created_at")),
        sample=Sample.from_dict(doc),
    )


def _error_from_response(response: httpx.Response, content: bytes) -> GatewayHTTPError:
    body: dict[str, Any] | None = None
    try:
        doc = orjson.loads(content)
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            body = doc["error"]
    except orjson.JSONDecodeError:
        pass
    message = (body or {}).get("message") or content.decode(errors="replace")[:500] or response.reason_phrase
    cls = GatewayRequestError if response.status_code < 500 else GatewayServerError
    if (body or {}).get("code") == "rollout_stored":
        cls = RolloutStoredError
    return cls(response.status_code, str(message), body, str(response.request.url))


class GatewayClient:
    """Async client of one gateway, with one pooled connection set.

    Use as `async with GatewayClient(url, key) as gw: ...`, or call `aclose()`. `api_key`
    is the tenant key (sent as a bearer token, never logged). `timeout` bounds each call;
    the trajectory stream extends its read timeout by the long-poll wait.
    """

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float = 60.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = timeout
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def _request(self, method: str, path: str, json: dict[str, Any] | None = None) -> Any:
        try:
            response = await self._http.request(method, path, json=json)
        except httpx.TransportError as exc:
            raise GatewayConnectionError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise _error_from_response(response, response.content)
        return orjson.loads(response.content) if response.content else None

    async def create_session(
        self,
        task_id: str,
        *,
        mode: str = "capture",
        rollout_id: str | None = None,
        group_index: int = 0,
        policy: str | None = None,
        metadata: dict[str, Any] | None = None,
        sampling: dict[str, Any] | None = None,
        sampling_precedence: str | None = None,
    ) -> SessionInfo:
        """Open a session for one task run (`mode`: capture or eval) and get its endpoint.

        Raises `RolloutStoredError` (with the stored summary) if `rollout_id`'s finish is stored.

        `sampling_precedence`: "session" (capture's default: `sampling` wins over what the agent
        sends) or "request" (eval's default: the agent's values apply).
        """
        payload: dict[str, Any] = {"task_id": task_id, "mode": mode, "group_index": group_index}
        optional = {
            "rollout_id": rollout_id,
            "policy": policy,
            "metadata": metadata,
            "sampling": sampling,
            "sampling_precedence": sampling_precedence,
        }
        payload.update({k: v for k, v in optional.items() if v is not None})
        doc = await self._request("POST", "/v1/sessions", payload)
        return SessionInfo(
            session_id=doc["session_id"],
            base_url=doc["base_url"],
            api_key=doc["api_key"],
            mode=doc["mode"],
            rollout_id=doc["rollout_id"],
        )

    async def finish_session(
        self,
        session_id: str,
        *,
        reward: float | None,
        status: str | None = None,
        termination_reason: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> FinishSummary:
        """Close the session with its reward; returns once its samples are durably stored."""
        payload: dict[str, Any] = {"reward": reward}
        optional = {"status": status, "termination_reason": termination_reason, "metadata": metadata}
        payload.update({k: v for k, v in optional.items() if v is not None})
        doc = await self._request("POST", f"/v1/sessions/{session_id}/finish", payload)
        return summary_from(doc)

    async def get_session(self, session_id: str) -> dict[str, Any]:
        """The session's current state, as the gateway reports it."""
        return await self._request("GET", f"/v1/sessions/{session_id}")

    async def delete_session(self, session_id: str) -> None:
        """Drop the session without storing anything."""
        await self._request("DELETE", f"/v1/sessions/{session_id}")

    async def get_trajectory(self, cursor: int) -> StoredTrajectory:
        """One stored sample by cursor (`GatewayRequestError` with status 404 if not yours)."""
        try:
            response = await self._http.get(f"/v1/trajectories/{cursor}")
        except httpx.TransportError as exc:
            raise GatewayConnectionError(f"GET /v1/trajectories/{cursor}: {exc}") from exc
        if response.status_code >= 400:
            raise _error_from_response(response, response.content)
        return _parse_trajectory(response.content)

    async def trajectories(
        self, *, after: int = 0, batch: int = 100, wait: float = 30.0
    ) -> AsyncIterator[StoredTrajectory]:
        """Follow the trajectory stream from `after`, forever, with long polls of `wait` seconds.

        Yields each sample once, in cursor order. On an error it raises; resume with
        `after=<last cursor seen>` to lose nothing. A poll that found nothing is followed by the
        next one `POLL_FLOOR` seconds after it began at the earliest, whatever `wait` is.
        """
        timeout = httpx.Timeout(self._timeout, read=self._timeout + wait)
        while True:
            params = {"after": after, "limit": batch, "wait": wait}
            started, found = time.monotonic(), False
            try:
                async with self._http.stream(
                    "GET", "/v1/trajectories", params=params, timeout=timeout
                ) as resp:
                    if resp.status_code >= 400:
                        raise _error_from_response(resp, await resp.aread())
                    async for line in resp.aiter_lines():
                        if line:
                            item = _parse_trajectory(line)
                            after, found = item.cursor, True
                            yield item
            except httpx.TransportError as exc:
                raise GatewayConnectionError(f"GET /v1/trajectories?after={after}: {exc}") from exc
            if not found:
                await asyncio.sleep(max(0.0, POLL_FLOOR - (time.monotonic() - started)))
