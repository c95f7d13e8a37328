"""A transparent HTTP proxy in front of the engine that remembers every `/generate` reply
(SGLang's, or vLLM's `/inference/v1/generate`, whose stream chunks are deltas).

Gateway tests put it between the gateway and the engine (real HTTP on both sides) to check
the ledger against what the engine actually returned for each request id.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.support.procs import serve_in_thread


@dataclass
class Exchange:
    """One `/generate` call: what was sent and what came back."""

    rid: str
    input_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: dict | None = None
    stream: bool = False


class Recorder:
    """The proxied exchanges, by rid."""

    def __init__(self) -> None:
        self.by_rid: dict[str, Exchange] = {}

    def record(self, ex: Exchange, final: dict) -> None:
        meta = final.get("meta_info") or {}
        triples = meta.get("output_token_logprobs") or []
        ex.output_ids = [t[1] for t in triples]
        ex.logprobs = [t[0] for t in triples]
        ex.finish_reason = meta.get("finish_reason")
        self.by_rid[ex.rid] = ex

    def record_vllm(self, ex: Exchange, chunks: list[dict]) -> None:
        """vLLM's reply, whole (one chunk) or streamed (each chunk's ids and logprobs are new)."""
        for chunk in chunks:
            for choice in chunk.get("choices") or []:
                ex.output_ids += choice.get("token_ids") or []
                ex.logprobs += [e["logprob"] for e in (choice.get("logprobs") or {}).get("content") or []]
                ex.finish_reason = {"type": choice["finish_reason"]} if choice.get("finish_reason") else None
        self.by_rid[ex.rid] = ex


VLLM_GENERATE = "/inference/v1/generate"


def _app(upstream: str, recorder: Recorder) -> Starlette:
    client = httpx.AsyncClient(base_url=upstream, timeout=600)

    async def forward(request: Request) -> Response:
        body = await request.body()
        path = request.url.path
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        if path not in ("/generate", VLLM_GENERATE):
            r = await client.request(
                request.method, path, content=body, headers=headers, params=request.query_params
            )
            return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))
        doc = orjson.loads(body)
        vllm = path == VLLM_GENERATE
        ex = Exchange(
            rid=doc.get("request_id" if vllm else "rid", ""),
            input_ids=list(doc.get("token_ids" if vllm else "input_ids") or []),
            stream=bool(doc.get("stream")),
        )
        if not ex.stream:
            r = await client.post(path, content=body, headers=headers)
            if r.status_code == 200:
                recorder.record_vllm(ex, [r.json()]) if vllm else recorder.record(ex, r.json())
            return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))
        req = client.build_request("POST", path, content=body, headers=headers)
        r = await client.send(req, stream=True)

        async def relay():
            chunks = []
            try:
                async for line in r.aiter_lines():
                    if line.startswith("data:") and line[5:].strip() != "[DONE]":
                        chunks.append(orjson.loads(line[5:].strip()))
                    yield (line + "\n").encode()
            finally:
                await r.aclose()
                if chunks and not any("error" in c for c in chunks):
                    recorder.record_vllm(ex, chunks) if vllm else recorder.record(ex, chunks[-1])

        return StreamingResponse(relay(), status_code=r.status_code, media_type="text/event-stream")

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST", "PUT", "DELETE"])])


@contextlib.contextmanager
def recording_proxy(upstream: str) -> Iterator[tuple[str, Recorder]]:
    """Serve the proxy on a free loopback port in a thread; yields (url, recorder)."""
    recorder = Recorder()
    with serve_in_thread(_app(upstream, recorder)) as url:
        yield url, recorder
