"""The engine's HTTP surface: SGLang's native routes over an `Engine`, as module-level routers.

Owns routing, request/response bytes, SSE framing, and tying each generation to its client
connection (a client that disconnects aborts its requests). Generation, queueing and weights are
the engine's (`rlgw.engine.core`); wire shapes are `rlgw.engine.protocol`'s; the error tree is
`rlgw.engine.errors`'. Routers: `generation` (/generate, /abort_request), `health` (/health,
/health_generate, /ready), `info` (model and server info), `control` (pause, continue, flush,
/update_weights_from_disk). `create_app(engine, routers)` stores the engine in `app.state.engine` and
mounts them all, plus the routers it is given (`rlgw engine` adds the weight-sync transports,
`rlgw.sync.engine_routes.router`: the engine imports nothing of sync's).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import orjson
from fastapi import APIRouter, FastAPI
from fastapi import Request as HttpRequest
from fastapi.responses import PlainTextResponse, Response, StreamingResponse

from rlgw import __version__
from rlgw.engine.core import Engine
from rlgw.engine.errors import EngineError, GrammarError, QueueFullError, RequestError, WeightUpdateError
from rlgw.engine.grammar import constraint_of
from rlgw.engine.protocol import GenerateCall, abort_status, parse_generate, render
from rlgw.engine.request import Request, Update, failed
from rlgw.engine.scheduler import PAUSE_MODES

log = logging.getLogger(__name__)

LOGPROB_SEMANTICS = (
    "logprobs are log_softmax(logits / temperature) after penalties and logit_bias, before top-k/top-p/min-p "
    "(SGLang's default, SGLANG_RETURN_ORIGINAL_LOGPROB unset), over the model's whole vocabulary "
    "(config.vocab_size, padded ids included; padded ids are never sampled); "
    "greedy requests get unscaled log_softmax(logits); "
    "input_token_logprobs are of the raw logits whatever the temperature, as SGLang's"
)
DISCONNECT_POLL_S = 0.25
HEALTH_PROBE_S = 20.0

generation = APIRouter()
health = APIRouter()
info = APIRouter()
control = APIRouter()


def create_app(engine: Engine, routers: Sequence[APIRouter] = ()) -> FastAPI:
    """A FastAPI app serving SGLang's native protocol from `engine`, and `routers` beside it."""
    app = FastAPI(title="rlgw engine", version=__version__)
    app.state.engine = engine
    app.add_exception_handler(RequestError, _request_error)
    for router in (generation, health, info, control, *routers):
        app.include_router(router)
    return app


# -- helpers -----------------------------------------------------------------------------------------


def _engine(request: HttpRequest) -> Engine:
    return request.app.state.engine


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


def _error(message: str, status: int) -> Response:
    return _json({"error": {"message": message}}, status)


async def _request_error(_: HttpRequest, exc: RequestError) -> Response:
    return _json(exc.body, 400)


async def _body(request: HttpRequest) -> Any:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from exc


def _parse(engine: Engine, body: Any) -> GenerateCall:
    return parse_generate(body, engine.tokenizer.encode)


async def _start(engine: Engine, call: GenerateCall) -> tuple[list[Request], asyncio.Queue]:
    """Check and submit every item of `call`; updates arrive on the returned queue as (index, Update).

    A constraint that does not compile fails its item the way SGLang's scheduler does: the request
    ends at once with a 400 abort (a 400 reply, or an error event in a stream).
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    reqs = []
    for item in call.items:
        engine.check_request(item.input_ids, item.logprob_start_len)
        grammar, refused = None, None
        if (constraint := constraint_of(item.params)) is not None:
            try:
                grammar = await asyncio.to_thread(engine.grammar_matcher, constraint)
            except GrammarError as exc:
                refused = failed(str(exc), 400, "BadRequestError")

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
                grammar=grammar,
                finish_reason=refused,
            )
        )
    engine.submit(reqs)
    return reqs, queue


def _abort_unfinished(engine: Engine, reqs: list[Request]) -> None:
    for r in reqs:
        if r.finish_reason is None:
            engine.abort(r.rid)


# -- generation ----------------------------------------------------------------------------------------


@generation.api_route("/generate", methods=["POST", "PUT"])
async def generate(request: HttpRequest) -> Response:
    """SGLang's `/generate`: single, batch or n > 1; streamed (SSE) or one JSON reply."""
    engine = _engine(request)
    call = _parse(engine, await _body(request))
    try:
        reqs, queue = await _start(engine, call)
    except QueueFullError as exc:
        return _error(str(exc), 503)
    if call.stream:
        return StreamingResponse(_stream(engine, call, reqs, queue), media_type="text/event-stream")
    return await _collect(request, engine, call, reqs, queue)


async def _collect(
    request: HttpRequest, engine: Engine, call: GenerateCall, reqs: list[Request], queue: asyncio.Queue
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
                    _abort_unfinished(engine, reqs)
                    return Response(status_code=499)
                continue
            if update.finish_reason is not None:
                finals[idx] = update
    finally:
        _abort_unfinished(engine, reqs)
    for update in finals.values():
        status = abort_status(update.finish_reason)
        if status is not None:
            return _error(update.finish_reason.get("message", "aborted"), status)
    decode_many = _decode_many(engine)
    outs = [render(item, reqs[item.index], finals[item.index], decode_many, False) for item in call.items]
    return _json(outs if call.listed else outs[0])


async def _stream(
    engine: Engine, call: GenerateCall, reqs: list[Request], queue: asyncio.Queue
) -> AsyncIterator[bytes]:
    decode_many = _decode_many(engine)
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
        _abort_unfinished(engine, reqs)


def _decode_many(engine: Engine):
    tok = engine.tokenizer
    return lambda ids: tok.batch_decode([[i] for i in ids])


@generation.post("/abort_request")
async def abort_request(request: HttpRequest) -> Response:
    """Abort one live request by exact rid, or all of them."""
    body = await _body(request)
    engine = _engine(request)
    if body.get("abort_all"):
        engine.abort(abort_all=True)
    elif isinstance(body.get("rid"), str):
        engine.abort(body["rid"])
    return Response(status_code=200)


# -- health --------------------------------------------------------------------------------------------


@health.get("/health")
async def health_route(request: HttpRequest) -> Response:
    """200 while the step loop runs."""
    return Response(status_code=200 if _engine(request).alive else 503)


@health.get("/health_generate")
async def health_generate(request: HttpRequest) -> Response:
    """200 if a one-token probe finishes within 20 s (or the engine is paused), else 503."""
    engine = _engine(request)
    if not engine.alive:
        return Response(status_code=503)
    if engine.paused:
        return Response(status_code=200)
    try:
        call = _parse(engine, {"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
        reqs, queue = await _start(engine, call)
    except EngineError:
        return Response(status_code=503)
    try:
        while True:
            _, update = await asyncio.wait_for(queue.get(), HEALTH_PROBE_S)
            if update.finish_reason is not None:
                return Response(status_code=200)
    except TimeoutError:
        _abort_unfinished(engine, reqs)
        return Response(status_code=503)


@health.get("/ready")
async def ready(request: HttpRequest) -> Response:
    """200, or 503 while paused or not alive."""
    engine = _engine(request)
    return Response(status_code=503 if engine.paused or not engine.alive else 200)


# -- info ----------------------------------------------------------------------------------------------


def _model_info(engine: Engine) -> dict[str, Any]:
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


@info.get("/model_info")
@info.get("/get_model_info")
async def model_info(request: HttpRequest) -> Response:
    """SGLang's model info (0.5.23 keys, plus `max_context_length`)."""
    return _json(_model_info(_engine(request)))


@info.get("/get_weight_version")
async def get_weight_version(request: HttpRequest) -> Response:
    """SGLang 0.5.5's weight-version route."""
    return _json({"weight_version": _engine(request).weight_version})


@info.get("/server_info")
@info.get("/get_server_info")
async def server_info(request: HttpRequest) -> Response:
    """The resolved settings, logprob semantics and queue/batch sizes."""
    engine = _engine(request)
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
            # SGLang's flag for honouring `sampling_seed`; this engine always does (one generator a request).
            "enable_deterministic_inference": True,
            "logprob_semantics": LOGPROB_SEMANTICS,
            "eos_token_ids": engine.eos_ids,
            "internal_states": [engine.load_stats()],
            "prefix_cache": engine.prefix.stats(),
            "version": f"rlgw-engine {__version__}",
            "startup_time": engine.started_at,
        }
    )


# -- control -------------------------------------------------------------------------------------------


@control.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: HttpRequest) -> Response:
    """Drop the kept KV caches (refused with 400 while requests run unpaused)."""
    if await asyncio.to_thread(_engine(request).flush_cache):
        return PlainTextResponse("Cache flushed.\nPlease check backend logs for more details.", 200)
    return PlainTextResponse("Cache not flushed: requests are running (pause generation first).", 400)


@control.post("/pause_generation")
async def pause_generation(request: HttpRequest) -> Response:
    """Pause in SGLang's "abort", "retract" or "in_place" mode."""
    mode = (await _body(request)).get("mode", "abort")
    if mode not in PAUSE_MODES:
        return _error(f"unknown pause mode {mode!r}: expected abort, retract or in_place", 400)
    await _engine(request).pause(mode)
    return _json({"message": "Generation paused successfully.", "status": "ok"})


@control.post("/continue_generation")
async def continue_generation(request: HttpRequest) -> Response:
    """Resume after a pause."""
    await _body(request)
    await _engine(request).resume()
    return _json({"message": "Generation continued successfully.", "status": "ok"})


def _weights_reply(success: bool, message: str, status: int = 200) -> Response:
    return _json({"success": success, "message": message, "num_paused_requests": 0}, status)


@control.post("/update_weights_from_disk")
async def update_weights_from_disk(request: HttpRequest) -> Response:
    """Load a safetensors checkpoint directory into the live model (all or nothing)."""
    engine = _engine(request)
    body = await _body(request)
    path, version = body.get("model_path"), body.get("weight_version")
    if not isinstance(path, str) or not path:
        return _weights_reply(False, "model_path is required", 400)
    if version is not None and not isinstance(version, str):
        return _weights_reply(False, "weight_version must be a string", 400)
    if body.get("abort_all_requests"):
        engine.abort(abort_all=True)
    started = time.monotonic()
    try:
        count = await engine.load_weights_from_dir(Path(path), version)
    except WeightUpdateError as exc:
        return _weights_reply(False, str(exc), 400)
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
    return _weights_reply(True, message)
