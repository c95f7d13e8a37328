"""What the operations layers add to one request: metrics, body cap, limits, the turn's accounting.

Runs a trivial ASGI app N times bare and wrapped in the gateway's edge (meter, body cap,
limit binding), in-process (no sockets: only the layers' own cost), and times the
per-turn calls a turn makes (`turn_slot` and `metrics.TURN_IN_FLIGHT` enter/exit, the limits' and
the metrics' `turn_generated`, `turn_recorded`).

    python -m bench.ops_overhead [--n 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from rlgw.gateway import metrics
from rlgw.gateway.serving.edge import Edge
from rlgw.gateway.tenancy.limits import Limits, LimitTable, turn_generated, turn_slot


async def _bare(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def _turn_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    with turn_slot("tenant"), metrics.TURN_IN_FLIGHT:
        turn_generated("tenant", 40)
        metrics.turn_generated("chat", 40)
        metrics.turn_recorded(840, 40)
    await _bare(scope, receive, send)


def _wrapped(app: Any) -> Any:
    table = LimitTable(Limits(open_sessions=1000, in_flight=1000, tokens_per_minute=10**12))
    return Edge(app, table=table, max_body_bytes=32 * 1024 * 1024, routes={})


async def _time(app: Any, n: int) -> list[float]:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/s/x/v1/chat/completions",
        "headers": [(b"content-length", b"2")],
    }
    body = {"type": "http.request", "body": b"{}", "more_body": False}

    async def receive() -> dict[str, Any]:
        return body

    async def send(message: dict[str, Any]) -> None:
        return None

    out = []
    for _ in range(n):
        start = time.perf_counter()
        await app(dict(scope), receive, send)
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    """Print p50/p99 per request, bare and with the layers, and the difference."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=20000)
    n = p.parse_args().n

    async def run() -> None:
        for label, bare, layered in (
            ("plain request", _bare, _wrapped(_bare)),
            ("turn request", _bare, _wrapped(_turn_app)),
        ):
            await _time(layered, 1000)  # warm up label children and caches
            # Interleave the two so machine noise hits both alike.
            a: list[float] = []
            b: list[float] = []
            for _ in range(10):
                a += await _time(bare, n // 10)
                b += await _time(layered, n // 10)
            qa, qb = statistics.quantiles(a, n=100), statistics.quantiles(b, n=100)
            print(
                f"{label:14s} bare p50 {qa[49] * 1e6:6.1f} us p99 {qa[98] * 1e6:6.1f} us | "
                f"with ops layers p50 {qb[49] * 1e6:6.1f} us p99 {qb[98] * 1e6:6.1f} us | "
                f"added p50 {(qb[49] - qa[49]) * 1e6:5.1f} us"
            )

    asyncio.run(run())


if __name__ == "__main__":
    main()
