"""`Http1Transport`: the engine hop as plain HTTP/1.1 over pooled keep-alive connections.

The gateway talks to one engine URL, always the same few requests: it needs keep-alive,
`Content-Length` and chunked bodies, and timeouts, and none of a general client's machinery
(cookies, redirects, proxies, tracing hooks, multidicts per request). Written for exactly that,
one `/generate` call takes 0.30 ms less than through aiohttp at 1k prompt ids and 0.44 ms less
at 32k (the head and the body go out in one write), measured by bench/engine_hop.py against
bench/stub_engine.py on this machine. `http://` only: `AiohttpTransport` serves `https://` engines.

Each connection is an `asyncio.Protocol` that gathers the bytes it receives and wakes its reader
once, when the bytes the reader waits for (a whole head, a whole body, a whole chunk) are there:
asyncio's streams wake it per arrival and wrap each read in a timeout scope of its own, which cost
a `/generate` call 0.08-0.1 ms more CPU, measured here at 1k and 32k prompt ids. One timer per
wait holds the deadline.

Connections are reused only after a response was read to its end with nothing after it; a
connection the engine closed while idle is dropped before use; any failure or cancellation
mid-exchange closes it. One race is left, the keep-alive race every HTTP/1.1 client meets: the
engine's idle timeout (uvicorn's, and so SGLang's: 5 s) closes a pooled connection just as a
request goes out on it, and the reply is an end of stream or a reset before its first byte. Such
a request is sent once more, on a new connection (it failed a turn with a 502 in
bench/gateway.py's load run): the engine closed that connection without answering, and if it
had begun to generate, nothing of that work reached the gateway, so nothing is recorded twice.
Errors are the transport's (`ConnectFailed` only when no connection was made, so a caller's
retry never repeats a request the engine may be answering).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import cast
from urllib.parse import urlsplit

from rlgw.gateway.engine_client.transport import ConnectFailed, ReadTimeout, TransportError

_MAX_HEAD = 64 * 1024  # bytes of status line and headers (or of a chunk's size line) a reply may have
# Unread bytes past which the connection stops reading until its reader wants more: a stream
# whose agent reads slowly holds the engine back (TCP backpressure) instead of filling memory.
_HIGH_WATER = 256 * 1024


class _Cut(Exception):
    """The connection ended before the bytes a reader waited for; `partial`: whether any of the
    reply had arrived."""

    def __init__(self, partial: bool, error: Exception | None) -> None:
        said = "mid-reply" if partial else "before answering"
        super().__init__(f"the engine closed the connection {said}" + (f" ({error!r})" if error else ""))
        self.partial = partial


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class _Connection(asyncio.Protocol):
    """One keep-alive connection: received bytes gather in `buffer`; `fill` waits for enough."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport  # set by connection_made, before the connection is handed out
        self.buffer = bytearray()
        self.ended = False  # the engine closed its side, or the connection is gone
        self.error: Exception | None = None
        self._need = 0
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False

    # -- the protocol (called by the event loop)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) >= self._need:
            self._wake()
            if len(self.buffer) > _HIGH_WATER and not self._paused:
                self._paused = True
                self.transport.pause_reading()

    def eof_received(self) -> bool:
        self.ended = True
        self._wake()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.error = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the reader's side

    def usable(self) -> bool:
        """Open, and holding no stray bytes (the previous reply was read exactly to its end)."""
        return not (self.ended or self.buffer or self.transport.is_closing())

    def close(self) -> None:
        self.ended = True
        self.transport.close()

    async def fill(self, need: int, deadline: float) -> None:
        """Wait until `buffer` holds `need` bytes; `_Cut` if the connection ends first,
        `TimeoutError` at `deadline` (the loop's clock)."""
        while len(self.buffer) < need:
            if self.ended:  # an end of stream or a reset: the same to the reader
                raise _Cut(bool(self.buffer), self.error)
            self._need = need
            if self._paused:
                self._paused = False
                self.transport.resume_reading()
            waiter = self._waiter = self.loop.create_future()
            timer = self.loop.call_at(deadline, _expire, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None

    async def until(self, marker: bytes, deadline: float) -> bytes:
        """Bytes up to the next `marker` (taken from `buffer` with it): a chunk's size line, or
        a reply's status line and headers."""
        start = 0
        while (end := self.buffer.find(marker, start)) < 0:
            if len(self.buffer) > _MAX_HEAD:
                raise ValueError(f"no {marker!r} in the engine's reply within {_MAX_HEAD} bytes")
            start = max(0, len(self.buffer) - len(marker) + 1)
            await self.fill(len(self.buffer) + 1, deadline)
        data = bytes(self.buffer[:end])
        del self.buffer[: end + len(marker)]
        return data

    async def take(self, size: int, deadline: float) -> bytes:
        """Exactly `size` bytes."""
        await self.fill(size, deadline)
        if len(self.buffer) == size:
            data = bytes(self.buffer)
            self.buffer.clear()
        else:
            data = bytes(self.buffer[:size])
            del self.buffer[:size]
        return data

    async def rest(self, deadline: float) -> bytes:
        """Everything until the engine closes the connection."""
        try:
            while True:
                await self.fill(len(self.buffer) + 1, deadline)
        except _Cut:
            if self.error is not None:
                raise  # a reset, not the end of the body
        data = bytes(self.buffer)
        self.buffer.clear()
        return data


@contextlib.contextmanager
def _failures(close: Callable[[], None], timed_out: str, failed: str) -> Iterator[None]:
    """Any exit by exception closes the connection (it is mid-exchange); the wire's failures
    become the transport's errors."""
    try:
        yield
    except TimeoutError as exc:
        close()
        raise ReadTimeout(timed_out) from exc
    except (OSError, _Cut, ValueError) as exc:
        close()
        raise TransportError(f"{failed}: {exc!r}") from exc
    except BaseException:
        close()
        raise


class _Reply:
    """One response: the head is read; the body is read by `read` or `lines` (once)."""

    def __init__(
        self, transport: Http1Transport, conn: _Connection, status: int, length: int | None, keep: bool
    ) -> None:
        self.status = status
        self._transport = transport
        self._conn: _Connection | None = conn
        self._length = length  # None: chunked; -1: until the engine closes the connection
        self._keep = keep

    def _taken(self) -> _Connection:
        conn = self._conn
        assert conn is not None, "the body was read already"
        self._conn = None
        return conn

    def _broken(self, conn: _Connection) -> contextlib.AbstractContextManager[None]:
        return _failures(conn.close, "the engine stopped sending its reply", "the engine's reply broke off")

    def _deadline(self, conn: _Connection) -> float:
        return conn.loop.time() + self._transport.read_timeout

    async def read(self) -> bytes:
        """The whole body."""
        if self._length is None:
            return b"".join([chunk async for chunk in self._chunks()])
        conn = self._taken()
        with self._broken(conn):
            if self._length >= 0:
                body = await conn.take(self._length, self._deadline(conn))
            else:
                body = await conn.rest(self._deadline(conn))
        self._transport.release(conn, self._keep and self._length >= 0)
        return body

    async def _chunks(self) -> AsyncIterator[bytes]:
        if self._length is not None:
            yield await self.read()
            return
        conn = self._taken()
        with self._broken(conn):
            # Each chunk within the read timeout of its own, as the engine streams.
            while size := int((await conn.until(b"\r\n", self._deadline(conn))).split(b";", 1)[0], 16):
                chunk = await conn.take(size + 2, self._deadline(conn))  # the data and its CRLF
                yield chunk[:-2]
            await conn.take(2, self._deadline(conn))  # the last chunk's CRLF (no trailers are sent)
        self._transport.release(conn, self._keep)

    async def lines(self) -> AsyncIterator[bytes]:
        """The body line by line (each with its line end; the last one may have none)."""
        rest = b""
        chunks = self._chunks()
        try:
            async for chunk in chunks:
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop()
                for line in lines:
                    yield line + b"\n"
        finally:
            await chunks.aclose()
            await self.close()  # closed early: the rest of the body is unread
        if rest:
            yield rest

    async def close(self) -> None:
        """Give up on the body (its connection is closed, not reused)."""
        if self._conn is not None:
            self._taken().close()


class Http1Transport:
    """`Transport` over pooled HTTP/1.1 keep-alive connections to one `http://` base URL."""

    def __init__(
        self,
        base_url: str,
        *,
        request_timeout: float = 600.0,
        connect_timeout: float = 10.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        url = urlsplit(base_url)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"Http1Transport needs an http:// URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self._host, self._port = url.hostname, url.port or 80
        self._prefix = url.path.rstrip("/")
        host = f"{self._host}:{self._port}" if url.port else self._host
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in {"Host": host, **(headers or {})}.items())
        self.read_timeout = request_timeout
        self._connect_timeout = connect_timeout
        self._idle: list[_Connection] = []

    async def _connect(self) -> tuple[_Connection, bool]:
        """A pooled connection that looks open, or a new one; and whether it was pooled."""
        while self._idle:
            conn = self._idle.pop()
            if conn.usable():
                return conn, True
            conn.close()
        return await self._open(), False

    async def _open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(lambda: _Connection(loop), self._host, self._port)
        except (OSError, TimeoutError) as exc:
            raise ConnectFailed(f"cannot connect to {self._host}:{self._port}: {exc!r}") from exc
        return conn

    def release(self, conn: _Connection, keep: bool) -> None:
        """Return a connection whose reply was read to its end to the pool (or close it)."""
        if keep and conn.usable():
            self._idle.append(conn)
        else:
            conn.close()

    async def request(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> _Reply:
        """Send one request and read the reply's head; the body is the reply's to read."""
        head = f"{method} {self._prefix}{path} HTTP/1.1\r\n{self._fixed}" + "".join(
            f"{k}: {v}\r\n" for k, v in headers.items()
        )
        head += f"Content-Length: {len(body)}\r\n\r\n" if body is not None else "\r\n"
        data = head.encode("latin-1") + body if body is not None else head.encode("latin-1")
        conn, pooled = await self._connect()
        with _failures(
            lambda: conn.close(), "the engine did not answer in time", "the exchange with the engine failed"
        ):
            if pooled:
                try:
                    return await self._exchange(conn, data)
                except _Cut as exc:  # an end of stream or a reset (a write never raises: the read sees it)
                    if exc.partial:
                        raise  # the engine had begun to answer
                conn = await self._open()  # the keep-alive race (see the module docstring)
            return await self._exchange(conn, data)

    async def _exchange(self, conn: _Connection, data: bytes) -> _Reply:
        """Write the request and read the reply's head; any failure closes the connection."""
        try:
            conn.transport.write(data)
            return self._head(conn, await conn.until(b"\r\n\r\n", conn.loop.time() + self.read_timeout))
        except BaseException:
            conn.close()
            raise

    def _head(self, conn: _Connection, raw: bytes) -> _Reply:
        lines = raw.split(b"\r\n")
        version, status = lines[0].split(b" ", 2)[:2]
        length: int | None = -1  # neither header: the body ends when the connection does
        keep = version == b"HTTP/1.1"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and value == b"chunked":
                length = None
            elif name == b"connection":
                keep = value == b"keep-alive" or (keep and value != b"close")
        code = int(status)
        if code in (204, 304) or 100 <= code < 200:
            length = 0
        return _Reply(self, conn, code, length, keep)

    async def aclose(self) -> None:
        """Close the idle connections."""
        while self._idle:
            self._idle.pop().close()
