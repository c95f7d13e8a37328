"""`Http1Transport` against a real uvicorn server (replies, streams, keep-alive, timeouts), and
against a raw socket server for the faults uvicorn will not produce on demand (a connection closed
while idle, a body cut short); each on asyncio's loop and on uvloop."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import orjson
import pytest
import uvloop
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rlgw.gateway.engine_client.http1_transport import Http1Transport
from rlgw.gateway.engine_client.transport import ConnectFailed, ReadTimeout, TransportError
from tests.support.procs import free_port, serve_in_thread

PEERS: list[tuple[str, int]] = []  # the client address of every request the server saw


async def echo(request: Request) -> Response:
    PEERS.append((request.client.host, request.client.port) if request.client else ("", 0))
    body = await request.body()
    return JSONResponse(
        {
            "path": request.url.path,
            "method": request.method,
            "length": len(body),
            "auth": request.headers.get("authorization"),
            "key": request.headers.get("x-smg-routing-key"),
        }
    )


async def stream(request: Request) -> Response:
    PEERS.append((request.client.host, request.client.port) if request.client else ("", 0))

    async def parts() -> AsyncIterator[bytes]:
        # Lines split across chunks, and a chunk holding several lines.
        for part in (b'data: {"a"', b': 1}\n\ndata: {"a": 2}\n\n', b"data: [DONE]\n\n"):
            yield part
            await asyncio.sleep(0.01)

    return StreamingResponse(parts(), media_type="text/event-stream")


async def slow(request: Request) -> Response:
    PEERS.append((request.client.host, request.client.port) if request.client else ("", 0))
    await asyncio.sleep(2)
    return Response(b"late")


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    app = Starlette(
        routes=[
            Route("/api/echo", echo, methods=["GET", "POST"]),
            Route("/api/stream", stream, methods=["POST"]),
            Route("/api/slow", slow, methods=["POST"]),
        ]
    )
    with serve_in_thread(app) as url:
        yield url


async def test_replies_are_read_whole_and_connections_reused(server: str) -> None:
    transport = Http1Transport(server + "/api", headers={"Authorization": "Bearer k"})
    PEERS.clear()
    for size in (0, 10, 300_000):
        reply = await transport.request("POST", "/echo", b"x" * size, {"X-SMG-Routing-Key": "s1"})
        assert reply.status == 200
        doc = orjson.loads(await reply.read())
        assert doc == {"path": "/api/echo", "method": "POST", "length": size, "auth": "Bearer k", "key": "s1"}
    reply = await transport.request("GET", "/echo", None, {})
    assert reply.status == 200 and b'"method":"GET"' in await reply.read()
    # One keep-alive connection served all four.
    assert len(set(PEERS)) == 1
    await transport.aclose()


async def test_a_chunked_stream_comes_line_by_line(server: str) -> None:
    transport = Http1Transport(server + "/api")
    PEERS.clear()
    reply = await transport.request("POST", "/stream", b"{}", {})
    lines = [line async for line in reply.lines()]
    assert [line for line in lines if line.strip()] == [
        b'data: {"a": 1}\n',
        b'data: {"a": 2}\n',
        b"data: [DONE]\n",
    ]
    reply = await transport.request("POST", "/stream", b"{}", {})
    assert await reply.read() == b'data: {"a": 1}\n\ndata: {"a": 2}\n\ndata: [DONE]\n\n'
    reply = await transport.request("POST", "/echo", b"", {})
    await reply.read()
    assert len(set(PEERS)) == 1  # the streams read to their ends left the connection reusable
    await transport.aclose()


async def test_a_stream_left_early_does_not_give_its_connection_back(server: str) -> None:
    transport = Http1Transport(server + "/api")
    PEERS.clear()
    reply = await transport.request("POST", "/stream", b"{}", {})
    lines = reply.lines()
    assert (await anext(lines)).startswith(b"data:")
    await lines.aclose()
    reply = await transport.request("POST", "/echo", b"", {})
    assert reply.status == 200 and b"/api/echo" in await reply.read()
    assert len(set(PEERS)) == 2  # the rest of the stream was unread: a new connection
    await transport.aclose()


async def test_no_listener_is_a_connect_failure() -> None:
    transport = Http1Transport(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ConnectFailed):
        await transport.request("POST", "/generate", b"{}", {})


async def test_an_engine_that_does_not_answer_times_out(server: str) -> None:
    transport = Http1Transport(server + "/api", request_timeout=0.3)
    with pytest.raises(ReadTimeout):
        await transport.request("POST", "/slow", b"", {})
    # The timed-out connection is not reused for the next request.
    transport.read_timeout = 10
    reply = await transport.request("POST", "/echo", b"", {})
    assert reply.status == 200 and b"/api/echo" in await reply.read()
    await transport.aclose()


async def test_a_cancelled_request_closes_its_connection(server: str) -> None:
    transport = Http1Transport(server + "/api")
    PEERS.clear()
    task = asyncio.ensure_future(transport.request("POST", "/slow", b"", {}))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    reply = await transport.request("POST", "/echo", b"", {})
    await reply.read()
    assert len(set(PEERS)) == 2
    await transport.aclose()


def test_only_plain_http_urls() -> None:
    with pytest.raises(ValueError, match="http://"):
        Http1Transport("https://engine:30000")


# ------------------------------------------------------------------- faults from a raw server


@contextlib.asynccontextmanager
async def _raw_engine(handler: object) -> AsyncIterator[Http1Transport]:
    """A transport to a raw socket server running `handler` per connection; both closed after."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)  # type: ignore[arg-type]
    transport = Http1Transport(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    try:
        yield transport
    finally:
        await transport.aclose()
        server.close()


async def test_a_connection_the_engine_closed_while_idle_is_not_used() -> None:
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await asyncio.sleep(0.05)  # then close it, as a server's keep-alive timeout does
        writer.close()

    async with _raw_engine(handle) as transport:
        for _ in range(2):
            reply = await transport.request("GET", "/", None, {})
            assert await reply.read() == b"ok"
            await asyncio.sleep(0.2)
        assert connections == 2


async def test_a_pooled_connection_closed_as_the_request_goes_out_is_retried_on_a_new_one() -> None:
    # The keep-alive race: the engine's idle timeout closes the connection the pool hands out
    # (here: on its second request, unanswered). Sent again on a new connection, not a 502.
    seen: list[tuple[int, int]] = []  # (connection, request on it) of every request received

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = len({c for c, _ in seen})
        for n in range(2):
            await reader.readuntil(b"\r\n\r\n")
            seen.append((index, n))
            if n == 1:
                break
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        writer.close()

    async with _raw_engine(handle) as transport:
        for _ in range(2):
            reply = await transport.request("GET", "/", None, {})
            assert await reply.read() == b"ok"
        assert seen == [(0, 0), (0, 1), (1, 0)]


async def test_a_new_connection_closed_before_an_answer_is_not_retried() -> None:
    requests = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        await reader.readuntil(b"\r\n\r\n")
        requests += 1
        writer.close()

    async with _raw_engine(handle) as transport:
        with pytest.raises(TransportError) as err:
            await transport.request("POST", "/generate", b"{}", {})
        assert not isinstance(err.value, ConnectFailed) and requests == 1


async def test_a_pooled_connection_cut_mid_head_is_not_retried() -> None:
    requests = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        for n in range(2):
            await reader.readuntil(b"\r\n\r\n")
            requests += 1
            # The second answer breaks off inside its head: the engine had begun to answer.
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" if n == 0 else b"HTTP/1.1 200")
            await writer.drain()
        writer.close()

    async with _raw_engine(handle) as transport:
        assert await (await transport.request("GET", "/", None, {})).read() == b"ok"
        with pytest.raises(TransportError):
            await transport.request("GET", "/", None, {})
        assert requests == 2


async def test_a_body_cut_short_is_a_transport_error() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part")
        await writer.drain()
        writer.close()

    async with _raw_engine(handle) as transport:
        reply = await transport.request("GET", "/", None, {})
        with pytest.raises(TransportError) as err:
            await reply.read()
        assert not isinstance(err.value, ConnectFailed)  # it may have reached the engine: no retry


async def test_a_body_without_a_length_ends_with_the_connection() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it")
        await writer.drain()
        writer.close()

    async with _raw_engine(handle) as transport:
        reply = await transport.request("GET", "/", None, {})
        assert reply.status == 200 and await reply.read() == b"all of it"


async def test_a_stream_read_slowly_holds_the_engine_back() -> None:
    # 32 MiB of stream, read one line and then left alone: the transport stops reading (TCP
    # backpressure), so neither its buffer nor what the engine got to send grows without bound.
    line = b"data: " + b"x" * (64 * 1024 - 7) + b"\n"
    lines, sent = 512, 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(lines):
            writer.write(b"%x\r\n%s\r\n" % (len(line), line))
            await writer.drain()
            sent += len(line)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async with _raw_engine(handle) as transport:
        reply = await transport.request("POST", "/generate", b"{}", {})
        conn = reply._conn
        assert conn is not None
        stream = reply.lines()
        assert await anext(stream) == line
        await asyncio.sleep(0.3)
        assert len(conn.buffer) <= 1024 * 1024
        assert sent < lines * len(line) // 2
        rest = [chunk async for chunk in stream]
        assert rest == [line] * (lines - 1) and sent == lines * len(line)


# ------------------------------------------------------------------- the same on uvloop

_CASES = [
    test_replies_are_read_whole_and_connections_reused,
    test_a_chunked_stream_comes_line_by_line,
    test_a_stream_left_early_does_not_give_its_connection_back,
    test_no_listener_is_a_connect_failure,
    test_an_engine_that_does_not_answer_times_out,
    test_a_cancelled_request_closes_its_connection,
    test_a_connection_the_engine_closed_while_idle_is_not_used,
    test_a_pooled_connection_closed_as_the_request_goes_out_is_retried_on_a_new_one,
    test_a_new_connection_closed_before_an_answer_is_not_retried,
    test_a_pooled_connection_cut_mid_head_is_not_retried,
    test_a_body_cut_short_is_a_transport_error,
    test_a_body_without_a_length_ends_with_the_connection,
    test_a_stream_read_slowly_holds_the_engine_back,
]


@pytest.mark.parametrize("case", _CASES, ids=[case.__name__[5:] for case in _CASES])
def test_on_uvloop(case: Callable[..., Awaitable[None]], server: str) -> None:
    # `rlgw serve` runs on uvloop (uvicorn's choice when it is installed): its transports are not
    # asyncio's classes, and its callbacks run in another order.
    takes_server = "server" in inspect.signature(case).parameters
    uvloop.run(case(server) if takes_server else case())
