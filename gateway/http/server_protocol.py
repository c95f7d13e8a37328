"""uvicorn's HTTP/1.1 protocol (httptools) with each response's head and body in one write.

uvicorn writes a response's head when the app sends `http.response.start` and its body when
the app sends `http.response.body`: two `send` calls on the socket for every reply. On loopback
(an agent beside the gateway, or a sidecar) each send runs the receiver's TCP path and wakes it,
so the agent is woken for the head alone, reads it, and sleeps until the body (in bench/gateway.py's
loop, one write saved about 90 us of the gateway's CPU per turn). Here the head is held until the next
write on the connection and goes out with it; if no write follows in the same pass of the event
loop (a stream whose first chunk is not ready, a `HEAD`, a 204), the head goes out alone at the
loop's next pass. Nothing is reordered and nothing else changes: every other call reaches the
socket's transport as it was.

    uvicorn.run(app, http=CoalescingHttpToolsProtocol)
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_STATUS_LINE = b"HTTP/1.1 "
_END_OF_HEAD = b"\r\n\r\n"


class HeadWithBodyTransport:
    """A transport whose writes of a response head wait for the body (see the module docstring).

    A write is held when it looks like a whole head (a status line through the blank line); a
    body that happens to look like one is only joined to the next write, never reordered.
    """

    __slots__ = ("_head", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._head: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Write `data`, after a held head; hold `data` itself if it is a head."""
        head = self._head
        if head is not None:
            self._head = None
            self._transport.write(head + data)
        elif data.startswith(_STATUS_LINE) and data.endswith(_END_OF_HEAD):
            self._head = bytes(data)
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def writelines(self, chunks: Any) -> None:
        """Write `chunks` in order, after a held head."""
        self.flush()
        self._transport.writelines(chunks)

    def flush(self) -> None:
        """Write a held head now (nothing when none is held)."""
        head = self._head
        if head is not None:
            self._head = None
            self._transport.write(head)

    def write_eof(self) -> None:
        """Flush, then close the write side."""
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        """Flush, then close: a held head still goes out first."""
        self.flush()
        self._transport.close()

    def get_write_buffer_size(self) -> int:
        """Bytes not yet on the socket, a held head included."""
        return self._transport.get_write_buffer_size() + len(self._head or b"")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol whose connections write a response's head with its body."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Serve the connection through a `HeadWithBodyTransport`."""
        super().connection_made(HeadWithBodyTransport(transport, self.loop))  # type: ignore[arg-type]
