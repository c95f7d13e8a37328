"""`rlgw serve`'s HTTP protocol writes a response's head with its body (`server_protocol.py`).

A real uvicorn server runs the protocol in a thread, under a real HTTP client; what reaches the
socket's transport is recorded underneath it. Every response kind must still arrive whole:
plain, streamed (a first chunk ready at once and one that is not), HEAD, 204, an error that
closes the connection, and a keep-alive connection serving several in a row.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rlgw.gateway.http.server_protocol import CoalescingHttpToolsProtocol, HeadWithBodyTransport
from tests.support.procs import free_port

WRITES: list[bytes] = []


class _Recorder:
    """The socket's transport, recording each write that reaches it."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def write(self, data: bytes) -> None:
        WRITES.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _RecordedProtocol(CoalescingHttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_Recorder(transport))  # type: ignore[arg-type]


async def _json(request: Request) -> Response:
    return JSONResponse({"answer": 42})


async def _stream(request: Request) -> Response:
    async def chunks() -> Any:
        yield b"data: 1\n\n"
        await asyncio.sleep(0.05)  # the next chunk is not ready at once
        yield b"data: 2\n\n"

    return StreamingResponse(chunks(), media_type="text/event-stream")


async def _late(request: Request) -> Response:
    async def chunks() -> Any:
        await asyncio.sleep(0.05)  # nothing is ready when the head is sent
        yield b"late"

    return StreamingResponse(chunks())


async def _empty(request: Request) -> Response:
    return Response(status_code=204)


async def _fails(request: Request) -> Response:
    raise RuntimeError("a handler bug")


APP = Starlette(
    routes=[
        Route("/json", _json, methods=["GET", "HEAD"]),
        Route("/stream", _stream),
        Route("/late", _late),
        Route("/empty", _empty),
        Route("/fails", _fails),
    ]
)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    port = free_port()
    config = uvicorn.Config(APP, host="127.0.0.1", port=port, log_level="critical", http=_RecordedProtocol)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=10)


def test_a_response_goes_out_in_one_write_and_keep_alive_still_works(server: str) -> None:
    WRITES.clear()
    with httpx.Client() as client:
        for _ in range(3):
            r = client.get(server + "/json")
            assert r.status_code == 200 and r.json() == {"answer": 42}
    assert len(WRITES) == 3  # one per response: head and body together
    assert all(w.startswith(b"HTTP/1.1 200 OK\r\n") and w.endswith(b'{"answer":42}') for w in WRITES)


def test_a_stream_sends_its_head_with_the_first_chunk_and_later_chunks_alone(server: str) -> None:
    WRITES.clear()
    with httpx.Client() as client:
        with client.stream("GET", server + "/stream") as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            assert b"".join(r.iter_bytes()) == b"data: 1\n\ndata: 2\n\n"
    assert WRITES[0].startswith(b"HTTP/1.1 200 OK") and WRITES[0].endswith(b"data: 1\n\n\r\n")
    assert b"data: 2" in WRITES[1]


@pytest.mark.parametrize(("method", "path", "status"), [("HEAD", "/json", 200), ("GET", "/empty", 204)])
def test_a_head_without_a_body_is_not_held(server: str, method: str, path: str, status: int) -> None:
    WRITES.clear()
    with httpx.Client(timeout=5) as client:
        r = client.request(method, server + path)
        assert r.status_code == status and r.content == b""
        assert client.get(server + "/json").json() == {"answer": 42}  # the connection is still in step
    assert WRITES[0].startswith(f"HTTP/1.1 {status}".encode()) and WRITES[0].endswith(b"\r\n\r\n")


def test_a_head_whose_body_is_late_goes_out_before_it(server: str) -> None:
    with socket.create_connection(
        (server.split("//")[1].split(":")[0], int(server.rsplit(":", 1)[1]))
    ) as sock:
        sock.sendall(b"GET /late HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(0.04)  # shorter than the body's delay: the head must already be here
        first = sock.recv(65536)
    assert first.startswith(b"HTTP/1.1 200 OK") and first.endswith(b"\r\n\r\n")


def test_an_error_response_is_sent_whole_before_the_connection_closes(server: str) -> None:
    with httpx.Client() as client:
        r = client.get(server + "/fails")
    assert r.status_code == 500 and r.text == "Internal Server Error"


class _Fake:
    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []

    def write(self, data: bytes) -> None:
        self.calls.append(("write", bytes(data)))

    def close(self) -> None:
        self.calls.append(("close", b""))

    def get_write_buffer_size(self) -> int:
        return 0


async def test_a_held_head_is_flushed_by_close_and_never_reordered() -> None:
    fake = _Fake()
    t = HeadWithBodyTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"
    t.write(head)
    assert fake.calls == [] and t.get_write_buffer_size() == len(head)
    t.close()
    assert fake.calls == [("write", head), ("close", b"")]
    # A body that looks like a head is held, then joined to what follows, in order.
    fake.calls.clear()
    t.write(b"HTTP/1.1 404 x\r\n\r\n")
    t.write(b"tail")
    assert fake.calls == [("write", b"HTTP/1.1 404 x\r\n\r\ntail")]
