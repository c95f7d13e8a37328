"""A stub engine that answers at once: SGLang's `/generate` and OpenAI's `/v1/chat/completions`.

For benchmarks of gateways alone: it does no inference and no tokenization (prompt sizes are
counted, never encoded), so every millisecond measured through it is the gateway's (or the
network's). `/generate` (what rlgw and the pass-through peer call) replies with a fixed tool
call pre-tokenized once with the served tokenizer; `/v1/chat/completions` (what a plain OpenAI
proxy such as LiteLLM's calls) replies with the same tool call in OpenAI's shape.

    python -m bench.stub_engine --tokenizer DIR --port 30001
"""

from __future__ import annotations

import argparse
import json
import time
import uuid

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

TOOL_CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
CALL_FUNCTION = {"name": "bash", "arguments": '{"command": "ls -la"}'}


def build_app(tokenizer_dir: str, context_length: int) -> Starlette:
    """The stub app: `/generate` (plain and SSE), `/v1/chat/completions`, `/model_info`, `/health`."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    reply = [*tok.encode(TOOL_CALL, add_special_tokens=False), eos]
    triples = [[-0.25, t, None] for t in reply]

    def result(n_in: int, rid: str) -> dict:
        return {
            "text": TOOL_CALL,
            "output_ids": reply,
            "meta_info": {
                "id": rid,
                "finish_reason": {"type": "stop", "matched": eos},
                "prompt_tokens": n_in,
                "completion_tokens": len(reply),
                "cached_tokens": 0,
                "weight_version": "default",
                "e2e_latency": 0.0,
                "output_token_logprobs": triples,
                "input_token_logprobs": [],
            },
        }

    async def generate(request: Request) -> Response:
        body = orjson.loads(await request.body())
        doc = result(len(body.get("input_ids") or []), body.get("rid") or uuid.uuid4().hex)
        if not body.get("stream"):
            return Response(orjson.dumps(doc), media_type="application/json")

        async def events():
            yield b"data: " + orjson.dumps(doc) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def chat_completions(request: Request) -> Response:
        body = orjson.loads(await request.body())
        # A size estimate, not a tokenization: the stub's own cost must stay flat.
        chars = sum(len(m.get("content") or "") for m in body.get("messages") or [])
        call = {"id": "call_" + uuid.uuid4().hex[:24], "type": "function", "function": CALL_FUNCTION}
        doc = {
            "id": "chatcmpl-" + uuid.uuid4().hex,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or "stub",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {
                "prompt_tokens": chars // 4,
                "completion_tokens": len(reply),
                "total_tokens": chars // 4 + len(reply),
            },
        }
        return Response(orjson.dumps(doc), media_type="application/json")

    async def model_info(request: Request) -> Response:
        return Response(
            json.dumps(
                {
                    "model_path": tokenizer_dir,
                    "tokenizer_path": tokenizer_dir,
                    "served_model_name": "stub",
                    "is_generation": True,
                    "weight_version": "default",
                    "max_context_length": context_length,
                }
            ),
            media_type="application/json",
        )

    async def ok(request: Request) -> Response:
        return Response(b"")

    return Starlette(
        routes=[
            Route("/generate", generate, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/model_info", model_info),
            Route("/health", ok),
            Route("/abort_request", ok, methods=["POST"]),
        ]
    )


def main() -> None:
    """Serve the stub on 127.0.0.1."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--context-length", type=int, default=65536)
    a = p.parse_args()
    uvicorn.run(build_app(a.tokenizer, a.context_length), host="127.0.0.1", port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
