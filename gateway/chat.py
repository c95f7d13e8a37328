"""One chat turn: ledger sync, incremental rendering, generation, parsing, recording.

This is the data flow of DESIGN.md ("Data flow of one turn") in code. The OpenAI request
and response shapes live in `openai_api.py`; this module turns a validated request into
engine calls and ledger commits, and yields OpenAI response objects (or SSE chunks).

Streamed and non-streamed turns share everything but the transport: the same detokenizer
and the same output parser see the same ids, so they return and record the same thing.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlgw.gateway.backend import GenerationResult, ModelBackend, new_rid
from rlgw.gateway.detokenize import IncrementalDetokenizer
from rlgw.gateway.errors import Conflict, ContextLengthExceeded, InvalidRequest
from rlgw.gateway.ledger import Ledger, Policy, TurnCommit, Violation
from rlgw.gateway.output_parser import OutputParser, ParsedOutput, ParseError, ParserEvent, ToolCall
from rlgw.gateway.render import ChatRenderer
from rlgw.gateway.sessions import Session

log = logging.getLogger(__name__)


@dataclass
class ModelProfile:
    """What the gateway knows about the served model (from the engine and the template)."""

    name: str
    tokenizer: Any
    renderer: ChatRenderer
    context_length: int
    tool_format: str | None
    reasoning: bool
    think_start_ids: tuple[int, ...] = ()


@dataclass
class ChatParams:
    """A validated chat request, reduced to what a turn needs."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    tool_choice: Any
    parallel_tool_calls: bool
    sampling: dict[str, Any]  # engine sampling params, without max_new_tokens
    max_tokens: int | None
    logprobs: bool
    top_logprobs: int
    stream: bool
    include_usage: bool
    template_kwargs: dict[str, Any]
    separate_reasoning: bool = True
    # The API surface the request came through (chat, messages, responses): a session that
    # switches surfaces opens a new segment with cause `mode_switch`.
    surface: str = "chat"


@dataclass
class Prepared:
    """The engine input for a turn, and what the ledger will record if it succeeds."""

    input_ids: np.ndarray
    increment: list[int]
    new_messages: list[dict[str, Any]] | None  # None: this turn is not recorded
    reasoning_forced: bool


def _tool_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def prepare_turn(profile: ModelProfile, session: Session, params: ChatParams) -> Prepared:
    """Sync the ledger with the incoming history and build the engine input (no side effects
    on the ledger except those its policy demands: a new segment, or passthrough)."""
    renderer = profile.renderer
    messages, tools, kw = params.messages, params.tools, params.template_kwargs
    ledger: Ledger | None = session.ledger
    if ledger is not None and ledger.capturing:
        new = ledger.sync(messages)
        if isinstance(new, Violation) and ledger.is_retry(messages):
            ledger.rollback_last_turn()
            log.info("turn retried", extra={"fields": {"session": session.id, "rolled_back": True}})
            new = ledger.sync(messages)
        if isinstance(new, Violation):
            new = messages if apply_policy(session, new) else []
        if ledger.capturing:
            seg = ledger.current
            last = seg.last_turn
            if last is None:
                inc = renderer.render_prompt(messages, tools, **kw)
                input_ids = np.asarray(inc, dtype=np.int32)
            else:
                if not new:
                    raise InvalidRequest("no new message since the last assistant turn", param="messages")
                inc = renderer.render_continuation(
                    new, tools, previous_ended_with_eos=last.ended_with_stop_token, **kw
                )
                input_ids = np.concatenate([seg.ids_view(), np.asarray(inc, dtype=np.int32)])
            return Prepared(input_ids, inc, list(new), _forced(profile, inc))
    ids = renderer.render_prompt(messages, tools, **kw)
    return Prepared(np.asarray(ids, dtype=np.int32), ids, None, _forced(profile, ids))


def apply_policy(session: Session, violation: Violation) -> bool:
    """Apply the session's policy to a rewritten history; True if capture goes on (new segment).

    `refuse` raises 409 and changes nothing; `passthrough` turns capture off for the session;
    `segment` closes the current segment and opens a new one that starts from this request.
    """
    ledger = session.ledger
    assert ledger is not None
    if session.policy is Policy.REFUSE:
        raise Conflict(f"{violation}; this session's policy is 'refuse'", code="history_rewritten")
    if session.policy is Policy.PASSTHROUGH:
        ledger.invalidate(str(violation))
        log.warning("capture turned off", extra={"fields": {"session": session.id, "reason": str(violation)}})
        return False
    ledger.new_segment(str(violation))
    return True


def _forced(profile: ModelProfile, ids: list[int]) -> bool:
    """Whether the generation prompt already opened a think block (reasoning is forced)."""
    k = len(profile.think_start_ids)
    return k > 0 and tuple(ids[-k:]) == profile.think_start_ids


def engine_sampling(
    profile: ModelProfile,
    session: Session,
    sampling: dict[str, Any],
    max_tokens: int | None,
    top_logprobs: int,
    prompt_len: int,
) -> dict[str, Any]:
    """SGLang sampling params for the turn, with `max_new_tokens` checked against the context."""
    room = profile.context_length - prompt_len
    if room <= 0:
        session.termination_reason = "context_length_exceeded"
        raise ContextLengthExceeded(
            f"This model's maximum context length is {profile.context_length} tokens. However, your "
            f"messages resulted in {prompt_len} tokens.",
            param="messages",
        )
    max_new = max_tokens if max_tokens is not None else session.sampling.get("max_tokens")
    if max_new is not None and max_new > room:
        session.termination_reason = "context_length_exceeded"
        raise ContextLengthExceeded(
            f"This model's maximum context length is {profile.context_length} tokens. However, you "
            f"requested {prompt_len + max_new} tokens ({prompt_len} in the messages, {max_new} in the "
            "completion). Please reduce the length of the messages or completion.",
            param="max_tokens",
        )
    sp = {k: v for k, v in session.sampling.items() if k != "max_tokens"}
    sp.update(sampling)
    sp["max_new_tokens"] = int(max_new if max_new is not None else room)
    if top_logprobs:
        sp["top_logprobs_num"] = top_logprobs
    return sp


class StopTrimmer:
    """Holds back text that may be the start of a stop string, so the agent never sees one.

    The engine's ids include the tokens that matched a stop string (they were sampled, and
    the ledger keeps them); only the text for the agent is trimmed, as SGLang does.
    """

    def __init__(self, stops: list[str]) -> None:
        self._stops = [s for s in stops if s]
        self._hold = max((len(s) for s in self._stops), default=0) + 8 if self._stops else 0
        self._buf = ""

    def feed(self, text: str) -> str:
        """Text that is safe to pass on now."""
        if not self._hold:
            return text
        self._buf += text
        if len(self._buf) <= self._hold:
            return ""
        out, self._buf = self._buf[: -self._hold], self._buf[-self._hold :]
        return out

    def close(self, matched: Any) -> str:
        """The held text, cut at `matched` if the generation stopped on that stop string."""
        buf, self._buf = self._buf, ""
        if isinstance(matched, str) and matched:
            i = buf.find(matched)
            if i >= 0:
                buf = buf[:i]
        return buf


@dataclass
class TurnOutput:
    """What the agent receives and the ledger records for one generated turn."""

    parsed: ParsedOutput
    call_ids: list[str]
    result: GenerationResult

    @property
    def finish_reason(self) -> str:
        """OpenAI's finish_reason: length, tool_calls or stop."""
        if self.result.finish_type == "length":
            return "length"
        return "tool_calls" if self.parsed.tool_calls else "stop"

    @property
    def matched_stop(self) -> Any:
        """SGLang's matched_stop (null when tool calls turned stop into tool_calls)."""
        return None if self.finish_reason == "tool_calls" else self.result.finish_reason.get("matched")


class TurnDecoder:
    """Sampled ids -> agent-visible events: detokenize, trim stop strings, parse."""

    def __init__(self, profile: ModelProfile, params: ChatParams, prepared: Prepared) -> None:
        use_tools = bool(params.tools) and params.tool_choice != "none"
        self.detok = IncrementalDetokenizer(profile.tokenizer, skip_special_tokens=True)
        stops = params.sampling.get("stop") or []
        self.trim = StopTrimmer([stops] if isinstance(stops, str) else list(stops))
        self.parser = OutputParser(
            tool_format=profile.tool_format if use_tools else None,
            tools=params.tools if use_tools else None,
            reasoning=profile.reasoning and params.separate_reasoning,
            reasoning_forced=prepared.reasoning_forced,
        )

    def feed(self, ids: list[int]) -> list[ParserEvent]:
        """Events for newly sampled ids."""
        return self.parser.feed(self.trim.feed(self.detok.feed(ids)))

    def close(self, result: GenerationResult) -> list[ParserEvent]:
        """Events for the rest of the text once the generation has finished."""
        tail = self.trim.feed(self.detok.flush()) + self.trim.close(result.finish_reason.get("matched"))
        return self.parser.feed(tail) + self.parser.close()


def commit_generation(
    session: Session,
    *,
    new_messages: list[dict[str, Any]] | None,
    increment: list[int],
    result: GenerationResult,
    response_id: str,
    call_ids: list[str],
    content: str,
    parse_errors: list[ParseError],
    end_of_turn_id: int | None,
    agent_text: str = "",
) -> None:
    """Commit a finished generation and its prompt increment to the session's ledger.

    The turn counts as closed only when its last sampled id is the template's end-of-turn
    token: a generation cut by length, a stop string, or another EOS (Qwen3 also stops on
    `<|endoftext|>`) gets the template's closing in the next increment, as a full render has it.
    """
    assert session.ledger is not None
    ended = bool(result.output_ids) and result.output_ids[-1] == end_of_turn_id
    session.ledger.commit(
        TurnCommit(
            new_messages=new_messages,
            prompt_ids=increment,
            output_ids=result.output_ids,
            logprobs=result.logprobs,
            version_spans=result.version_spans,
            response_id=response_id,
            tool_call_ids=tuple(call_ids),
            content=content,
            rid=result.rid,
            finish_type=result.finish_type,
            ended_with_stop_token=ended,
            parse_errors=[{"kind": e.kind, "detail": e.detail, "raw": e.raw} for e in parse_errors],
            agent_text=agent_text,
        ),
        result.weight_version,
    )


def record_turn(
    profile: ModelProfile, session: Session, prepared: Prepared, out: TurnOutput, response_id: str
) -> None:
    """Commit a finished chat turn to the session's ledger (when this turn is recorded)."""
    session.turns += 1
    if prepared.new_messages is None or session.ledger is None or not session.ledger.capturing:
        return
    commit_generation(
        session,
        new_messages=prepared.new_messages,
        increment=prepared.increment,
        result=out.result,
        response_id=response_id,
        call_ids=out.call_ids,
        content=out.parsed.content,
        parse_errors=out.parsed.errors,
        end_of_turn_id=profile.renderer.stop_token_ids[0],
    )


def _message(parsed: ParsedOutput, call_ids: list[str]) -> dict[str, Any]:
    msg: dict[str, Any] = {
        "role": "assistant",
        "content": parsed.content,
        "reasoning_content": parsed.reasoning_content,
    }
    if parsed.tool_calls:
        msg["tool_calls"] = [
            {
                "id": cid,
                "index": c.index,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c, cid in zip(parsed.tool_calls, call_ids, strict=True)
        ]
    return msg


def _logprobs(profile: ModelProfile, result: GenerationResult) -> dict[str, Any]:
    """OpenAI-shaped logprobs for the sampled tokens (only built when the agent asks)."""
    tok = profile.tokenizer

    def entry(tid: int, lp: float) -> dict[str, Any]:
        text = tok.decode([tid])
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}

    content = []
    for i, (tid, lp) in enumerate(zip(result.output_ids, result.logprobs, strict=True)):
        e = entry(tid, lp)
        e["top_logprobs"] = [entry(t, v) for v, t in (result.top_logprobs[i] if result.top_logprobs else [])]
        content.append(e)
    return {"content": content}


def _usage(prepared: Prepared, result: GenerationResult) -> dict[str, Any]:
    n_in, n_out = len(prepared.input_ids), len(result.output_ids)
    return {
        "prompt_tokens": n_in,
        "completion_tokens": n_out,
        "total_tokens": n_in + n_out,
        "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
    }


def _check_parallel(params: ChatParams, parsed: ParsedOutput) -> None:
    # Calls are never dropped (the sampled tokens contain them all); a request that forbade
    # parallel calls, or required one, gets the breach flagged in the sample's metadata.
    if not params.parallel_tool_calls and len(parsed.tool_calls) > 1:
        parsed.errors.append(_flag("parallel_tool_calls_violated", f"{len(parsed.tool_calls)} calls"))
    choice = params.tool_choice
    if params.tools and (choice == "required" or isinstance(choice, dict)) and not parsed.tool_calls:
        parsed.errors.append(_flag("tool_choice_unmet", f"tool_choice={choice!r} but no call was made"))


def _flag(kind: str, detail: str) -> ParseError:
    return ParseError(kind=kind, detail=detail, raw="")


async def run_turn(
    backend: ModelBackend, profile: ModelProfile, session: Session, params: ChatParams
) -> dict[str, Any]:
    """A non-streamed chat turn: returns the ChatCompletion object."""
    async with session.lock:
        prepared = prepare_turn(profile, session, params)
        sampling = engine_sampling(
            profile, session, params.sampling, params.max_tokens, params.top_logprobs, len(prepared.input_ids)
        )
        rid = new_rid()
        session.active_rids.add(rid)
        try:
            result = await backend.generate(prepared.input_ids, sampling, rid=rid, routing_key=session.id)
        except BaseException:
            session.failed_turns += 1
            raise
        finally:
            session.active_rids.discard(rid)
        decoder = TurnDecoder(profile, params, prepared)
        decoder.feed(result.output_ids)
        decoder.close(result)
        parsed = decoder.parser.result()
        _check_parallel(params, parsed)
        out = TurnOutput(parsed, [_tool_call_id() for _ in parsed.tool_calls], result)
        response_id = "chatcmpl-" + uuid.uuid4().hex
        record_turn(profile, session, prepared, out, response_id)
    choice: dict[str, Any] = {
        "index": 0,
        "message": _message(parsed, out.call_ids),
        "finish_reason": out.finish_reason,
        "matched_stop": out.matched_stop,
        "logprobs": _logprobs(profile, result) if params.logprobs else None,
    }
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": profile.name,
        "choices": [choice],
        "usage": _usage(prepared, result),
        "metadata": {"weight_version": result.weight_version},
    }


def _chunk(response_id: str, created: int, model: str, delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, **extra}
    return {
        "id": response_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }


def _event_chunks(
    events: list[ParserEvent], calls: list[ToolCall], call_ids: list[str]
) -> list[dict[str, Any]]:
    """OpenAI deltas for parser events (a tool call: its name chunk, then its arguments)."""
    deltas: list[dict[str, Any]] = []
    for ev in events:
        if ev.kind == "content" and ev.text:
            deltas.append({"content": ev.text})
        elif ev.kind == "reasoning" and ev.text:
            deltas.append({"reasoning_content": ev.text})
        elif ev.kind == "tool_call" and ev.call is not None:
            cid = _tool_call_id()
            calls.append(ev.call)
            call_ids.append(cid)
            head = {"id": cid, "index": ev.call.index, "type": "function"}
            deltas.append({"tool_calls": [{**head, "function": {"name": ev.call.name, "arguments": ""}}]})
            args = {"index": ev.call.index, "function": {"arguments": ev.call.arguments}}
            deltas.append({"tool_calls": [{**args, "id": None, "type": "function"}]})
    return deltas


async def stream_turn(
    backend: ModelBackend, profile: ModelProfile, session: Session, params: ChatParams
) -> AsyncIterator[dict[str, Any]]:
    """A streamed chat turn: yields ChatCompletionChunk objects as the engine samples.

    Raises before the first chunk for errors that have an HTTP status (bad request, context
    length); the caller turns errors after the first chunk into an in-stream error event.
    """
    await session.lock.acquire()
    try:
        prepared = prepare_turn(profile, session, params)
        sampling = engine_sampling(
            profile, session, params.sampling, params.max_tokens, params.top_logprobs, len(prepared.input_ids)
        )
    except BaseException:
        session.lock.release()
        raise
    return _stream_body(backend, profile, session, params, prepared, sampling)


async def _stream_body(
    backend: ModelBackend,
    profile: ModelProfile,
    session: Session,
    params: ChatParams,
    prepared: Prepared,
    sampling: dict[str, Any],
) -> AsyncIterator[dict[str, Any]]:
    response_id = "chatcmpl-" + uuid.uuid4().hex
    created = int(time.time())
    rid = new_rid()
    decoder = TurnDecoder(profile, params, prepared)
    calls: list[ToolCall] = []
    call_ids: list[str] = []
    session.active_rids.add(rid)
    ok = False
    try:
        yield _chunk(response_id, created, profile.name, {"role": "assistant", "content": ""})
        result: GenerationResult | None = None
        async for update in backend.stream(prepared.input_ids, sampling, rid=rid, routing_key=session.id):
            events = decoder.feed(update.new_ids) if update.new_ids else []
            if update.result is not None:
                result = update.result
                events += decoder.close(result)
            for delta in _event_chunks(events, calls, call_ids):
                yield _chunk(response_id, created, profile.name, delta)
        assert result is not None
        parsed = decoder.parser.result()
        _check_parallel(params, parsed)
        out = TurnOutput(parsed, call_ids, result)
        record_turn(profile, session, prepared, out, response_id)
        ok = True
        final = {"finish_reason": out.finish_reason, "matched_stop": out.matched_stop}
        yield _chunk(response_id, created, profile.name, {}, **final)
        if params.include_usage:
            yield {
                "id": response_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": profile.name,
                "choices": [],
                "usage": _usage(prepared, result),
            }
    finally:
        session.active_rids.discard(rid)
        if not ok:
            session.failed_turns += 1
        session.lock.release()
