"""A pass-through peer for bench/gateway.py: the same two hops as the gateway, no recording.

It accepts the agent's chat request, parses it, sends the stub engine a `/generate` body
with as many input ids as the gateway would (drawn from the same vocabulary, so the body has
about the same size), and answers the engine's reply. Whatever it
adds over a direct call is the floor that any out-of-process gateway pays on this machine
(uvicorn + aiohttp, the fastest pair measured here); bench/gateway.py prints it beside rlgw.

    python -m bench.passthrough --engine-url URL --port N
"""

from __future__ import annotations

import argparse

import aiohttp
import numpy as np
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

# Ids drawn like a real prompt's (Qwen3's vocabulary), so the engine request body is as many
# bytes as the gateway's: its size, not just its length, is part of the hop's cost.
ENGINE_IDS = np.random.default_rng(0).integers(0, 151_643, size=1 << 17, dtype=np.int32)


def build_app(engine_url: str) -> Starlette:
    """POST /chat: body {"messages": [...], "n_ids": N} -> the engine's /generate reply."""
    state: dict[str, aiohttp.ClientSession] = {}

    async def chat(request: Request) -> Response:
        doc = orjson.loads(await request.body())
        ids = ENGINE_IDS[: int(doc["n_ids"])]
        payload = orjson.dumps({"input_ids": ids, "return_logprob": True}, option=orjson.OPT_SERIALIZE_NUMPY)
        if "s" not in state:
            state["s"] = aiohttp.ClientSession(json_serialize=None)
        async with state["s"].post(
            engine_url + "/generate", data=payload, headers={"Content-Type": "application/json"}
        ) as r:
            body = await r.read()
        return Response(body, media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(b"")

    return Starlette(routes=[Route("/chat", chat, methods=["POST"]), Route("/health", health)])


def main() -> None:
    """Serve the peer on 127.0.0.1."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine-url", required=True)
    p.add_argument("--port", type=int, required=True)
    a = p.parse_args()
    uvicorn.run(build_app(a.engine_url), host="127.0.0.1", port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
