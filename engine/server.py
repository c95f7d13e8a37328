"""The engine's HTTP surface: SGLang's native routes over an `Engine` core.

Owns routing, request/response bytes, SSE framing, and tying each generation to its client
connection (a client that disconnects aborts its requests). Generation itself, queueing and
weights are the core's (`rlgw.engine.core`); wire shapes are `rlgw.engine.protocol`'s.
`create_app(engine)` stores the core in `app.state.engine` and mounts the weight-sync router
(`rlgw.engine.weight_sync_routes`) as it is.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import PlainTextResponse, Response, StreamingResponse

from rlgw import __version__
from rlgw.engine import weight_sync_routes
from rlgw.engine.core import (
    Engine,
    EngineError,
    QueueFullError,
    Request,
    RequestError,
    Update,
    WeightUpdateError,
)
from rlgw.engine.protocol import (
    GenerateCall,
    ProtocolError,
    abort_status,
    bad_request,
    parse_generate,
    render,
)

log = logging.getLogger(__name__)

LOGPROB_SEMANTICS = (
    "logprobs are log_softmax(logits / temperature) after penalties and logit_bias, before top-k/top-p/min-p "
    "(SGLang's default, SGLANG_RETURN_ORIGINAL_LOGPROB unset); "
    "greedy requests get unscaled log_softmax(logits); "
    "input_token_logprobs use the request's temperature the same way"
)
DISCONNECT_POLL_S = 0.25


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


def _error(message: str, status: int) -> Response:
    return _json({"error": {"message": message}}, status)


async def _body(request: HttpRequest) -> Any:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from exc


def create_app(engine: Engine) -> FastAPI:
    """A FastAPI app serving SGLang's native protocol from `engine`."""
    app = FastAPI(title="rlgw engine", version=__version__)
    app.state.engine = engine
    app.include_router(weight_sync_routes.router)
    tok = engine.tokenizer

    def encode(text: str) -> list[int]:
        return tok.encode(text)

    def decode_many(ids: list[int]) -> list[str]:
        return tok.batch_decode([[i] for i in ids])

    @app.exception_handler(ProtocolError)
    async def _protocol_error(_: HttpRequest, exc: ProtocolError) -> Response:
        return _json(exc.body, 400)

    def _start(call: GenerateCall) -> tuple[list[Request], asyncio.Queue]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        reqs = []
        for item in call.items:
            try:
                engine.check_request(item.input_ids, item.params, item.logprob_start_len)
            except RequestError as exc:
                raise bad_request(str(exc)) from exc

            def sink(update: Update, idx: int = item.index) -> None:
                loop.call_soon_threadsafe(queue.put_nowait, (idx, update))

            reqs.append(
                Request(
                    rid=item.rid,
                    input_ids=item.input_ids,
                    params=item.params,
                    sink=sink,
                    stream=call.stream,
                    return_logprob=item.return_logprob,
                    logprob_start_len=item.logprob_start_len,
                    top_logprobs_num=item.top_logprobs_num,
                )
            )
        engine.submit(reqs)
        return reqs, queue

    def _abort_unfinished(reqs: list[Request]) -> None:
        for r in reqs:
            if r.finish_reason is None:
                engine.abort(r.rid)

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: HttpRequest) -> Response:
        call = parse_generate(await _body(request), encode)
        try:
            reqs, queue = _start(call)
        except QueueFullError as exc:
            return _error(str(exc), 503)
        except RequestError as exc:
            return _error(str(exc), 400)
        if call.stream:
            return StreamingResponse(_stream(call, reqs, queue), media_type="text/event-stream")
        return await _collect(request, call, reqs, queue)

    async def _collect(
        request: HttpRequest, call: GenerateCall, reqs: list[Request], queue: asyncio.Queue
    ) -> Response:
        finals: dict[int, Update] = {}
        try:
            while len(finals) < len(reqs):
                try:
                    idx, update = await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S)
                except TimeoutError:
                    if await request.is_disconnected():
                        log.info(
                            "client disconnected; aborting", extra={"fields": {"rids": [r.rid for r in reqs]}}
                        )
                        _abort_unfinished(reqs)
                        return Response(status_code=499)
                    continue
                if update.finish_reason is not None:
                    finals[idx] = update
        finally:
            _abort_unfinished(reqs)
        for update in finals.values():
            status = abort_status(update.finish_reason)
            if status is not None:
                return _error(update.finish_reason.get("message", "aborted"), status)
        outs = [render(item, reqs[item.index], finals[item.index], decode_many, False) for item in call.items]
        return _json(outs if call.listed else outs[0])

    async def _stream(call: GenerateCall, reqs: list[Request], queue: asyncio.Queue) -> AsyncIterator[bytes]:
        done = 0
        try:
            while done < len(reqs):
                idx, update = await queue.get()
                item = call.items[idx]
                if update.finish_reason is not None:
                    done += 1
                obj = render(item, reqs[idx], update, decode_many, call.listed)
                status = abort_status(update.finish_reason)
                if status is not None:
                    obj = {
                        "error": {
                            "message": update.finish_reason.get("message", "aborted"),
                            "type": "invalid_request_error" if status < 500 else "internal_error",
                            "code": status,
                            "retryable": False,
                        }
                    }
                yield b"data: " + orjson.dumps(obj) + b"\n\n"
            yield b"data: [DONE]\n\n"
        finally:
            # Runs on normal completion and when the client goes away (the response task is cancelled).
            _abort_unfinished(reqs)

    @app.post("/abort_request")
    async def abort_request(request: HttpRequest) -> Response:
        body = await _body(request)
        if body.get("abort_all"):
            engine.abort(abort_all=True)
        elif isinstance(body.get("rid"), str):
            engine.abort(body["rid"])
        return Response(status_code=200)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if engine.alive else 503)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        if not engine.alive:
            return Response(status_code=503)
        if engine.paused:
            return Response(status_code=200)
        try:
            call = parse_generate(
                {"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0}}, encode
            )
            reqs, queue = _start(call)
        except (EngineError, ProtocolError):
            return Response(status_code=503)
        try:
            while True:
                _, update = await asyncio.wait_for(queue.get(), 20.0)
                if update.finish_reason is not None:
                    return Response(status_code=200)
        except TimeoutError:
            _abort_unfinished(reqs)
            return Response(status_code=503)

    @app.get("/ready")
    async def ready() -> Response:
        return Response(status_code=503 if engine.paused or not engine.alive else 200)

    def model_info() -> dict[str, Any]:
        cfg = engine.model.config
        return {
            "model_path": str(engine.model_path),
            "tokenizer_path": str(engine.model_path),
            "served_model_name": engine.config.served_model_name or engine.model_path.name,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": engine.weight_version,
            "load_format": "auto",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": getattr(cfg, "model_type", None),
            "architectures": getattr(cfg, "architectures", None),
            "max_context_length": engine.max_context_length,
        }

    @app.get("/model_info")
    async def get_model_info_route() -> Response:
        return _json(model_info())

    @app.get("/get_model_info")
    async def get_model_info_alias() -> Response:
        return _json(model_info())

    @app.get("/get_weight_version")
    async def get_weight_version() -> Response:
        return _json({"weight_version": engine.weight_version})

    async def server_info() -> Response:
        c = engine.config
        return _json(
            {
                "model_path": str(engine.model_path),
                "tokenizer_path": str(engine.model_path),
                "served_model_name": c.served_model_name or engine.model_path.name,
                "weight_version": engine.weight_version,
                "max_queued_requests": c.max_queue,
                "max_running_requests": c.max_running,
                "chunked_prefill_size": c.chunked_prefill_size,
                "threads": c.threads,
                "context_length": engine.max_context_length,
                "dtype": "float32",
                "device": "cpu",
                "return_original_logprob": c.original_logprob,
                "logprob_semantics": LOGPROB_SEMANTICS,
                "eos_token_ids": engine.eos_ids,
                "internal_states": [engine.load_stats()],
                "version": f"rlgw-engine {__version__}",
                "startup_time": engine.started_at,
            }
        )

    app.add_api_route("/server_info", server_info, methods=["GET"])
    app.add_api_route("/get_server_info", server_info, methods=["GET"])

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        if await asyncio.to_thread(engine.flush_cache):
            return PlainTextResponse("Cache flushed.\nPlease check backend logs for more details.", 200)
        return PlainTextResponse("Cache not flushed: requests are running (pause generation first).", 400)

    @app.post("/pause_generation")
    async def pause_generation(request: HttpRequest) -> Response:
        mode = (await _body(request)).get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            return _error(f"unknown pause mode {mode!r}: expected abort, retract or in_place", 400)
        await engine.pause(mode)
        return _json({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def continue_generation(request: HttpRequest) -> Response:
        await _body(request)
        await engine.resume()
        return _json({"message": "Generation continued successfully.", "status": "ok"})

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: HttpRequest) -> Response:
        body = await _body(request)
        path, version = body.get("model_path"), body.get("weight_version")
        if not isinstance(path, str) or not path:
            return _json(
                {"success": False, "message": "model_path is required", "num_paused_requests": 0}, 400
            )
        if version is not None and not isinstance(version, str):
            return _json(
                {"success": False, "message": "weight_version must be a string", "num_paused_requests": 0},
                400,
            )
        if body.get("abort_all_requests"):
            engine.abort(abort_all=True)
        started = time.monotonic()
        try:
            count = await engine.load_weights_from_dir(Path(path), version)
        except WeightUpdateError as exc:
            return _json({"success": False, "message": str(exc), "num_paused_requests": 0}, 400)
        message = "Succeeded to update model weights."
        if version is not None:
            message += f" Weight version updated to {version}."
        log.info(
            "weights loaded from disk",
            extra={
                "fields": {
                    "path": path,
                    "tensors": count,
                    "weight_version": engine.weight_version,
                    "seconds": round(time.monotonic() - started, 3),
                }
            },
        )
        return _json({"success": True, "message": message, "num_paused_requests": 0})

    return app
