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
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from rlgw.gateway.engine_client.backend import GenerationResult, first_answer
from rlgw.gateway.errors import InvalidRequest
from rlgw.gateway.ids import fresh_hex
from rlgw.gateway.ledger.ledger import Violation
from rlgw.gateway.model.profile import ModelProfile
from rlgw.gateway.parsing.detokenize import IncrementalDetokenizer, StopTrimmer
from rlgw.gateway.serving.flow import Surface
from rlgw.gateway.serving.routing import EVENT_HEADER
from rlgw.gateway.sessions.table import Session
from rlgw.gateway.turns.lifecycle import (
    Outcome,
    Plan,
    Turn,
    commit,
    decide,
    engine_sampling,
    routed_start,
    turn_scope,
)
from rlgw.gateway.turns.messages import token_logprobs

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


def _plan(profile: ModelProfile, session: Session, req: CompletionRequest, event: str | None) -> Plan:
    """The engine input for a completions turn and what it records. Changes nothing."""
    tok = profile.tokenizer
    ledger = session.ledger

    def encode(text: str, first: bool) -> list[int]:
        return tok.encode(text, add_special_tokens=first)

    if ledger is None or not ledger.capturing:
        ids = encode(req.prompt, True) if isinstance(req.prompt, str) else list(req.prompt)
        return Plan(np.asarray(ids, dtype=np.int32), ids, False)
    seg = ledger.current
    new = ledger.sync_prompt(req.prompt)
    plan = Plan(np.zeros(0, dtype=np.int32), [], True, None, "completions")
    if isinstance(new, Violation):
        decision = decide(session, new, event)
        if isinstance(decision, str):
            plan.invalidate, plan.recorded = decision, False
        else:
            plan.segment = decision
        new, first, base = req.prompt, True, np.zeros(0, dtype=np.int32)
    else:
        first, base = not seg.turns, seg.ids_view()
    inc = encode(new, first) if isinstance(new, str) else list(new)
    if not inc and not first:
        raise InvalidRequest("the prompt adds nothing after the last completion", param="prompt")
    plan.input_ids = np.concatenate([base, np.asarray(inc, dtype=np.int32)])
    plan.increment = inc
    plan.agent_text = new if isinstance(new, str) else ""
    return plan


def _check_ids(prompt: list[int], vocab_size: int) -> None:
    """Prompt ids must be tokens the model has: a 400 now, not a sample rejected at finish."""
    if not prompt:
        raise InvalidRequest("prompt is empty", param="prompt")
    try:
        ids = np.asarray(prompt, dtype=np.int64)
    except OverflowError:
        ids = None
    if ids is None or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise InvalidRequest(f"prompt token ids must be in [0, {vocab_size})", param="prompt")


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


def _logprobs(
    profile: ModelProfile, ids: list[int], logprobs: list[float], top: list[list[tuple[float, int]]] | None
) -> dict[str, Any]:
    """OpenAI's legacy logprobs object for sampled tokens (offsets relative to these tokens)."""
    entries = token_logprobs(profile, ids, logprobs, top)
    offsets, pos = [], 0
    for e in entries:
        offsets.append(pos)
        pos += len(e.token)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [dict(e.top) for e in entries] if top is not None else None,
        "text_offset": offsets,
    }


def _finish(result: GenerationResult) -> str:
    return "length" if result.finish_type == "length" else "stop"


@dataclass
class CompletionCall:
    """An accepted completions request, with its response's id and the turn's shared steps."""

    req: CompletionRequest
    event: str | None
    arrived: float = field(default_factory=time.monotonic)
    response_id: str = field(default_factory=lambda: "cmpl-" + fresh_hex())
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def stream(self) -> bool:
        """Whether the agent asked for a stream."""
        return self.req.stream

    @property
    def stops(self) -> list[str]:
        """The request's stop strings."""
        stop = self.req.stop
        return [stop] if isinstance(stop, str) else list(stop or [])

    def doc(self, profile: ModelProfile, choice: dict[str, Any], **extra: Any) -> dict[str, Any]:
        """A text_completion object (or chunk) around `choice`."""
        return {
            "id": self.response_id,
            "object": "text_completion",
            "created": self.created,
            "model": profile.name,
            "choices": [choice],
            **extra,
        }

    def prepare(self, profile: ModelProfile, session: Session) -> tuple[Plan, dict[str, Any], dict[str, Any]]:
        """The turn's plan and engine sampling (and what the agent asked for that was overridden)."""
        plan = _plan(profile, session, self.req, self.event)
        sampling, overridden = engine_sampling(
            profile,
            session,
            _sampling(self.req),
            self.req.max_tokens,
            self.req.logprobs or 0,
            len(plan.input_ids),
        )
        return plan, sampling, overridden

    async def finish(
        self,
        profile: ModelProfile,
        turn: Turn,
        plan: Plan,
        result: GenerationResult,
        text: str,
        overridden: dict[str, Any],
        sampling: dict[str, Any],
    ) -> None:
        """Commit the turn: the prompt's extension and the sampled ids."""
        plan.agent_text += text
        # No chat template continues a completions series: no end-of-turn id, no calls.
        outcome = Outcome(
            response_id=self.response_id, content=text, overridden=overridden, sampling=sampling
        )
        await commit(profile, turn, plan, result, outcome)


def _usage(plan: Plan, result: GenerationResult) -> dict[str, int]:
    n_in, n_out = len(plan.input_ids), len(result.output_ids)
    return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}


class Completions(Surface[CompletionCall]):
    """OpenAI's legacy completions: raw prompts, text or token ids."""

    path = "/completions"
    name = "completions"
    summary = "A completions turn for `session`, streamed or not."

    def accept(self, request: Request, session: Session, body: dict[str, Any]) -> CompletionCall:
        """The request validated (prompt ids within the vocabulary)."""
        req = CompletionRequest.model_validate(body)
        _check(req)
        if isinstance(req.prompt, list):
            _check_ids(req.prompt, request.app.state.profile.vocab_size)
        return CompletionCall(req, request.headers.get(EVENT_HEADER))

    async def run(self, request: Request, session: Session, call: CompletionCall) -> dict[str, Any]:
        """The text_completion object."""
        state = request.app.state
        profile: ModelProfile = state.profile
        req = call.req
        async with turn_scope(session, arrived=call.arrived) as turn:
            plan, sampling, overridden = call.prepare(profile, session)
            result = await state.backend.generate(
                plan.input_ids,
                sampling,
                rid=turn.rid,
                routing_key=session.id,
                routed_from=routed_start(profile, plan),
            )
            trim = StopTrimmer(call.stops)
            text = trim.feed(profile.tokenizer.decode(result.output_ids, skip_special_tokens=True))
            text += trim.close(result.finish_reason.get("matched"))
            await call.finish(profile, turn, plan, result, text, overridden, sampling)
        choice = {
            "index": 0,
            "text": text,
            "logprobs": (
                _logprobs(profile, result.output_ids, result.logprobs, result.top_logprobs)
                if req.logprobs is not None
                else None
            ),
            "finish_reason": _finish(result),
        }
        return call.doc(profile, choice, usage=_usage(plan, result))

    async def stream(
        self, request: Request, session: Session, call: CompletionCall
    ) -> AsyncIterator[dict[str, Any]]:
        """The text_completion chunks."""
        state = request.app.state
        profile: ModelProfile = state.profile
        req = call.req
        async with turn_scope(session, arrived=call.arrived) as turn:
            plan, sampling, overridden = call.prepare(profile, session)
            detok = IncrementalDetokenizer(profile.tokenizer, skip_special_tokens=True)
            trim = StopTrimmer(call.stops)
            text = ""
            updates = await first_answer(
                state.backend.stream(
                    plan.input_ids,
                    sampling,
                    rid=turn.rid,
                    routing_key=session.id,
                    routed_from=routed_start(profile, plan),
                )
            )
            yield call.doc(profile, {"index": 0, "text": "", "logprobs": None, "finish_reason": None})
            result: GenerationResult | None = None
            async for update in updates:
                piece = trim.feed(detok.feed(update.new_ids)) if update.new_ids else ""
                if update.result is not None:
                    result = update.result
                    piece += trim.feed(detok.flush()) + trim.close(result.finish_reason.get("matched"))
                lp = None
                if req.logprobs is not None and update.new_ids:
                    lp = _logprobs(profile, update.new_ids, update.new_logprobs, update.new_top)
                if piece or lp:
                    text += piece
                    yield call.doc(
                        profile, {"index": 0, "text": piece, "logprobs": lp, "finish_reason": None}
                    )
            if result is None:
                raise RuntimeError("the engine stream ended without a result")
            await call.finish(profile, turn, plan, result, text, overridden, sampling)
        yield call.doc(profile, {"index": 0, "text": "", "logprobs": None, "finish_reason": _finish(result)})
        if (req.stream_options or {}).get("include_usage"):
            yield {**call.doc(profile, {}), "choices": [], "usage": _usage(plan, result)}


Completions().register(router)
