"""`/v1/completions`: raw prompts (text or token ids) through the same ledger.

A session's completions must extend each other: a text prompt must start with the text the
agent has seen so far (its earlier prompts and our completions), an ids prompt with the ids
the ledger holds. Only the extension is tokenized (mask 0); the sampled ids are appended
verbatim (mask 1). Anything else follows the session's policy, as for chat. The first text
prompt is tokenized with the tokenizer's special tokens (BOS where the model has one); later
extensions without. A stop token the engine sampled stays in the series even though the
agent's text does not show it: the model was fed what it sampled.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response, StreamingResponse

from rlgw.gateway.backend import GenerationResult, new_rid
from rlgw.gateway.chat import ModelProfile, StopTrimmer, apply_policy, commit_generation, engine_sampling
from rlgw.gateway.detokenize import IncrementalDetokenizer
from rlgw.gateway.errors import InvalidRequest, json_response
from rlgw.gateway.ledger import Violation
from rlgw.gateway.openai_api import (
    cancel_on_disconnect,
    parse_body,
    session_for_key,
    session_for_path,
    sse_stream,
)
from rlgw.gateway.sessions import Session

router = APIRouter()


class CompletionRequest(BaseModel):
    """OpenAI's (legacy) completions request."""

    model_config = ConfigDict(extra="ignore")

    prompt: str | list[int]
    model: str | None = None
    max_tokens: int | None = Field(16, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = None
    min_p: float | None = Field(None, ge=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: int | None = Field(None, ge=0, le=20)
    n: int = Field(1, ge=1)
    echo: bool = False
    suffix: str | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None


def _prepare(
    profile: ModelProfile, session: Session, req: CompletionRequest
) -> tuple[np.ndarray, list[int], str, bool]:
    """(engine input, increment ids, increment text, recorded?) for a completions turn."""
    tok = profile.tokenizer
    ledger = session.ledger

    def encode(text: str, first: bool) -> list[int]:
        return tok.encode(text, add_special_tokens=first)

    if ledger is not None and ledger.capturing:
        new = ledger.sync_prompt(req.prompt)
        if isinstance(new, Violation) and apply_policy(session, new):
            new = req.prompt
        if ledger.capturing:
            seg = ledger.current
            first = not seg.turns
            text = new if isinstance(new, str) else ""
            inc = encode(new, first) if isinstance(new, str) else list(new)
            if not inc and not first:
                raise InvalidRequest("the prompt adds nothing after the last completion", param="prompt")
            ids = np.concatenate([seg.ids_view(), np.asarray(inc, dtype=np.int32)])
            return ids, inc, text, True
    ids = encode(req.prompt, True) if isinstance(req.prompt, str) else list(req.prompt)
    return np.asarray(ids, dtype=np.int32), ids, "", False


def _check(req: CompletionRequest) -> None:
    if req.n != 1:
        raise InvalidRequest("n > 1 is not supported: open one session per sample", param="n")
    if req.echo:
        raise InvalidRequest("echo is not supported", param="echo")
    if req.suffix:
        raise InvalidRequest("suffix is not supported", param="suffix")
    if isinstance(req.prompt, str) and not req.prompt:
        raise InvalidRequest("prompt is empty", param="prompt")


def _sampling(req: CompletionRequest) -> dict[str, Any]:
    sp = {
        k: getattr(req, k)
        for k in ("temperature", "top_p", "top_k", "min_p", "stop")
        if getattr(req, k) is not None
    }
    if req.seed is not None:
        sp["sampling_seed"] = req.seed
    return sp


def _logprobs(profile: ModelProfile, result: GenerationResult) -> dict[str, Any]:
    tok = profile.tokenizer
    tokens = [tok.decode([t]) for t in result.output_ids]
    offsets, pos = [], 0
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    top = None
    if result.top_logprobs is not None:
        top = [{tok.decode([t]): v for v, t in row} for row in result.top_logprobs]
    return {"tokens": tokens, "token_logprobs": result.logprobs, "top_logprobs": top, "text_offset": offsets}


def _finish(result: GenerationResult) -> str:
    return "length" if result.finish_type == "length" else "stop"


async def _turn(request: Request, session: Session) -> Response:
    state = request.app.state
    session.last_active = time.monotonic()
    profile: ModelProfile = state.profile
    req = CompletionRequest.model_validate(await parse_body(request))
    _check(req)
    top_n = req.logprobs or 0
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    await session.lock.acquire()
    try:
        input_ids, inc, inc_text, recorded = _prepare(profile, session, req)
        sampling = engine_sampling(profile, session, _sampling(req), req.max_tokens, top_n, len(input_ids))
    except BaseException:
        session.lock.release()
        raise
    response_id = "cmpl-" + uuid.uuid4().hex
    created = int(time.time())
    rid = new_rid()

    def finish_turn(result: GenerationResult, text: str) -> None:
        session.turns += 1
        if recorded:
            commit_generation(
                session,
                new_messages=None,
                increment=inc,
                result=result,
                response_id=response_id,
                call_ids=[],
                content=text,
                parse_errors=[],
                end_of_turn_id=None,  # no chat template continues a completions series
                agent_text=inc_text + text,
            )

    def doc(choice: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {
            "id": response_id,
            "object": "text_completion",
            "created": created,
            "model": profile.name,
            "choices": [choice],
            **extra,
        }

    def usage(result: GenerationResult) -> dict[str, int]:
        n_in, n_out = len(input_ids), len(result.output_ids)
        return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}

    if not req.stream:
        try:
            session.active_rids.add(rid)
            work = state.backend.generate(input_ids, sampling, rid=rid, routing_key=session.id)
            result = await cancel_on_disconnect(request, work)
            trim = StopTrimmer(stops)
            text = trim.feed(profile.tokenizer.decode(result.output_ids, skip_special_tokens=True))
            text += trim.close(result.finish_reason.get("matched"))
            finish_turn(result, text)
        except BaseException:
            session.failed_turns += 1
            raise
        finally:
            session.active_rids.discard(rid)
            session.lock.release()
        choice = {
            "index": 0,
            "text": text,
            "logprobs": _logprobs(profile, result) if req.logprobs is not None else None,
            "finish_reason": _finish(result),
        }
        return json_response(200, doc(choice, usage=usage(result)))

    async def chunks() -> AsyncIterator[dict[str, Any]]:
        detok = IncrementalDetokenizer(profile.tokenizer, skip_special_tokens=True)
        trim = StopTrimmer(stops)
        text = ""
        ok = False
        session.active_rids.add(rid)
        try:
            yield doc({"index": 0, "text": "", "logprobs": None, "finish_reason": None})
            async for update in state.backend.stream(input_ids, sampling, rid=rid, routing_key=session.id):
                piece = trim.feed(detok.feed(update.new_ids)) if update.new_ids else ""
                if update.result is not None:
                    result = update.result
                    piece += trim.feed(detok.flush()) + trim.close(result.finish_reason.get("matched"))
                if piece:
                    text += piece
                    yield doc({"index": 0, "text": piece, "logprobs": None, "finish_reason": None})
            finish_turn(result, text)
            ok = True
            yield doc({"index": 0, "text": "", "logprobs": None, "finish_reason": _finish(result)})
            if (req.stream_options or {}).get("include_usage"):
                yield {**doc({}), "choices": [], "usage": usage(result)}
        finally:
            session.active_rids.discard(rid)
            if not ok:
                session.failed_turns += 1
            session.lock.release()

    gen = chunks()
    first = await gen.__anext__()
    return StreamingResponse(sse_stream(first, gen), media_type="text/event-stream")


@router.post("/s/{session_id}/v1/completions")
async def completions_by_path(request: Request, session_id: str) -> Response:
    """Completions for the session named in the path."""
    return await _turn(request, session_for_path(request, session_id))


@router.post("/v1/completions")
async def completions_by_key(request: Request) -> Response:
    """Completions for the session whose key is the bearer token."""
    return await _turn(request, session_for_key(request))
