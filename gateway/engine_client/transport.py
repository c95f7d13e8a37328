"""The engine client's transport seam: send one HTTP request, hand back one reply.

A `Transport` knows URLs, bytes and sockets and nothing else: no retries, no SGLang, no error
policy (those are `backend.SGLangBackend`'s, as httpx keeps redirects and auth in its client
and I/O in its transports). Three implementations:

- `Http1Transport` (`http1_transport.py`): production for `http://` engines; plain HTTP/1.1
  over pooled keep-alive connections, the cheapest per call measured here.
- `AiohttpTransport`: `https://` engines; one pooled aiohttp session per process (measured here
  about 1 ms per call cheaper than httpx).
- `HandlerTransport`: an in-process async handler answers instead of a server, so tests can
  script an engine's replies and faults without starting one (httpx's `MockTransport`).

What can go wrong on the wire is said with three types, so the client can decide what is
safe to retry:

TransportError             the exchange failed after the request may have been sent
├── ConnectFailed          no connection was made: the request was never sent (safe to retry)
└── ReadTimeout            the engine did not answer (or stream) in time
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import aiohttp


class TransportError(Exception):
    """The exchange with the engine failed; the request may have reached it."""


class ConnectFailed(TransportError):
    """No connection could be made: the request was never sent."""


class ReadTimeout(TransportError):
    """The engine did not answer in time."""


class Reply(Protocol):
    """One engine reply: its status, then its body read whole or line by line."""

    status: int

    async def read(self) -> bytes: ...

    def lines(self) -> AsyncIterator[bytes]: ...

    async def close(self) -> None: ...


class Transport(Protocol):
    """Sends one request; raises `TransportError`s only."""

    async def request(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Reply: ...

    async def aclose(self) -> None: ...


class _AiohttpReply:
    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status

    async def read(self) -> bytes:
        async with _MapErrors():
            try:
                return await self._resp.read()
            finally:
                self._resp.release()

    async def lines(self) -> AsyncIterator[bytes]:
        async with _MapErrors():
            try:
                async for line in self._resp.content:
                    yield line
            finally:
                self._resp.release()

    async def close(self) -> None:
        self._resp.release()


class _MapErrors:
    """aiohttp's failures as `TransportError`s (an async context manager usable in generators)."""

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> bool:
        if exc is None or isinstance(exc, TransportError | asyncio.CancelledError | GeneratorExit):
            return False
        if isinstance(exc, aiohttp.ClientConnectorError):
            raise ConnectFailed(repr(exc)) from exc
        if isinstance(exc, TimeoutError):
            raise ReadTimeout("the engine did not answer in time") from exc
        if isinstance(exc, aiohttp.ClientError):
            raise TransportError(repr(exc)) from exc
        return False


class AiohttpTransport:
    """`Transport` over one pooled aiohttp session (created inside the running loop)."""

    def __init__(
        self,
        base_url: str,
        *,
        request_timeout: float = 600.0,
        connect_timeout: float = 10.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout, sock_read=request_timeout
        )
        self._headers = headers or {}
        self._session: aiohttp.ClientSession | None = None

    def _pool(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, headers=self._headers, json_serialize=None
            )
        return self._session

    async def request(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Reply:
        """Send one request; the reply's body is read by the caller."""
        async with _MapErrors():
            resp = await self._pool().request(method, self.base_url + path, data=body, headers=headers)
        return _AiohttpReply(resp)

    async def aclose(self) -> None:
        """Close the pooled session."""
        if self._session is not None:
            await self._session.close()


Handler = Callable[[str, str, bytes | None], Awaitable[tuple[int, bytes | AsyncIterator[bytes]]]]


@dataclass
class _HandlerReply:
    status: int
    body: bytes | AsyncIterator[bytes]

    async def read(self) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        return b"".join([chunk async for chunk in self.body])

    async def lines(self) -> AsyncIterator[bytes]:
        if isinstance(self.body, bytes):
            for line in self.body.splitlines(keepends=True):
                yield line
            return
        async for chunk in self.body:
            for line in chunk.splitlines(keepends=True):
                yield line

    async def close(self) -> None:
        return None


class HandlerTransport:
    """`Transport` answered by `handler(method, path, body)` in process: for tests.

    The handler returns `(status, body)`, the body as bytes or an async iterator of chunks (a
    stream); it may raise `TransportError`s to play a failing network.
    """

    def __init__(self, handler: Handler) -> None:
        self._handler = handler

    async def request(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Reply:
        """Answer with the handler."""
        status, payload = await self._handler(method, path, body)
        return _HandlerReply(status, payload)

    async def aclose(self) -> None:
        """Nothing to close."""
        return None
