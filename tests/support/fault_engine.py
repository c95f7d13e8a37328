"""An engine that misbehaves on cue: fault injection over real HTTP for the gateway tests.

It speaks SGLang's `/generate` (plain and SSE) and `/model_info`, and takes a script of
behaviours, one per `/generate` call: "ok", "503", "500", "400", "abort", "other_eos" (stop
on `<|endoftext|>`), "drop" (close the stream after one chunk), "slow" (sleep 3 s, past the
test client's read timeout). It remembers the rids it was asked to abort. The gateway talks
to it through aiohttp, which `respx` cannot intercept, so faults are injected on the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.support.procs import serve_in_thread


@dataclass
class FaultEngine:
    """The script, what was seen, and the reply ids."""

    url: str = ""
    script: list[str] = field(default_factory=list)
    calls: list[dict] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    reply: list[int] = field(default_factory=list)
    eos: int = 0
    other_eos: int = 0


def _app(fe: FaultEngine, tokenizer_path: Path, context_length: int) -> Starlette:
    def result(rid: str, n_in: int, ids: list[int], finish: dict) -> dict:
        return {
            "text": "",
            "output_ids": ids,
            "meta_info": {
                "id": rid,
                "finish_reason": finish,
                "prompt_tokens": n_in,
                "completion_tokens": len(ids),
                "cached_tokens": 0,
                "weight_version": "v7",
                "output_token_logprobs": [[-0.5, t, None] for t in ids],
            },
        }

    async def generate(request: Request) -> Response:
        body = orjson.loads(await request.body())
        fe.calls.append(body)
        action = fe.script.pop(0) if fe.script else "ok"
        rid, n_in = body.get("rid", ""), len(body.get("input_ids") or [])
        if action in ("503", "500", "400"):
            return Response(
                orjson.dumps({"error": {"message": f"injected {action}"}}), status_code=int(action)
            )
        if action == "slow":
            await asyncio.sleep(3)
        finish = {"type": "stop", "matched": fe.eos}
        reply = fe.reply
        if action == "other_eos":  # stopped on a second EOS (Qwen3 also stops on <|endoftext|>)
            reply = [*fe.reply[:-1], fe.other_eos]
            finish = {"type": "stop", "matched": fe.other_eos}
        if action == "abort":
            finish = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
        doc = result(rid, n_in, reply, finish)
        if not body.get("stream"):
            return Response(orjson.dumps(doc), media_type="application/json")

        async def events():
            half = result(rid, n_in, fe.reply[:1], None)
            yield b"data: " + orjson.dumps(half) + b"\n\n"
            if action == "drop":
                raise RuntimeError("injected: connection dropped mid-stream")
            yield b"data: " + orjson.dumps(doc) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def model_info(request: Request) -> Response:
        doc = {
            "model_path": str(tokenizer_path),
            "tokenizer_path": str(tokenizer_path),
            "served_model_name": "fault",
            "weight_version": "v7",
            "max_context_length": context_length,
        }
        return Response(orjson.dumps(doc), media_type="application/json")

    async def abort(request: Request) -> Response:
        fe.aborted.append(orjson.loads(await request.body()).get("rid", ""))
        return Response(b"")

    async def ok(request: Request) -> Response:
        return Response(b"")

    return Starlette(
        routes=[
            Route("/generate", generate, methods=["POST"]),
            Route("/model_info", model_info),
            Route("/health", ok),
            Route("/abort_request", abort, methods=["POST"]),
        ]
    )


@contextlib.contextmanager
def fault_engine(tokenizer_path: Path, context_length: int = 4096) -> Iterator[FaultEngine]:
    """Serve a `FaultEngine` on a free loopback port in a thread."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    fe = FaultEngine()
    fe.eos = tok.convert_tokens_to_ids("<|im_end|>")
    fe.other_eos = tok.convert_tokens_to_ids("<|endoftext|>")
    fe.reply = [*tok.encode("Hello there.", add_special_tokens=False), fe.eos]
    with serve_in_thread(_app(fe, tokenizer_path, context_length)) as url:
        fe.url = url
        yield fe
