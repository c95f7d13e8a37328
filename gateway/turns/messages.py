"""One chat turn: ledger sync, incremental rendering, generation, parsing, recording.

This is the data flow of the architecture document ("Data flow of one turn") in code, for any
surface that speaks in messages (Chat Completions, Anthropic Messages, OpenAI Responses): each
translates its request into `ChatParams` and its response from what this module returns or
yields. The lifecycle (lock, counters, commit) is `lifecycle.py`'s; the response shapes are the
surfaces'. This module knows nothing about HTTP or any wire format.

Streamed and non-streamed turns share everything but the transport: the same detokenizer
and the same output parser see the same ids, so they return and record the same thing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlgw.gateway.engine_client.backend import GenerationResult, ModelBackend, first_answer
from rlgw.gateway.errors import InvalidRequest
from rlgw.gateway.ids import fresh_hex
from rlgw.gateway.ledger.ledger import (
    Cause,
    Synced,
    Violation,
    canonical_arguments,
    history_print,
    tools_digest,
)
from rlgw.gateway.model.profile import ModelProfile
from rlgw.gateway.parsing.detokenize import IncrementalDetokenizer, StopTrimmer
from rlgw.gateway.parsing.output_parser import OutputParser, ParsedOutput, ParseError, ParserEvent, ToolCall
from rlgw.gateway.parsing.tool_choice_grammar import CONSTRAINED_NOTE, tool_choice_grammar
from rlgw.gateway.sessions.table import Session
from rlgw.gateway.turns.lifecycle import (
    Outcome,
    Plan,
    Turn,
    commit,
    decide,
    duplicate_cause,
    engine_sampling,
    new_records,
    routed_start,
    turn_scope,
)


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
    event: str | None = None  # a segment cause the agent states (`X-Rlgw-Event`)
    # What the surface changed in the request, for the sample's metadata (key -> values noted
    # once per segment), e.g. `dropped_tools`: hosted tools left out of the template's list.
    notes: dict[str, list[Any]] = field(default_factory=dict)
    arrived: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class TokenLogprob:
    """One sampled token's logprob (and its alternatives) as the agent is shown it."""

    token: str
    logprob: float
    top: list[tuple[str, float]]


@dataclass
class ChatTurn:
    """A finished chat turn: what the agent receives (the ledger has recorded it already)."""

    response_id: str
    created: int
    parsed: ParsedOutput
    call_ids: list[str]
    result: GenerationResult
    prompt_tokens: int
    logprobs: list[TokenLogprob] | None
    reasoning_tokens: int  # sampled tokens of the reasoning, up to the one that closed it

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


@dataclass(slots=True)
class ChatStart:
    """The first item of a streamed turn: the request was accepted and generation starts."""

    response_id: str
    created: int


@dataclass(slots=True)
class ChatDelta:
    """A piece of a streamed turn: text, reasoning, one whole tool call, or a call as it is
    sampled (its start, then pieces of its arguments), with the logprobs of the tokens sampled
    since the previous piece that carried some."""

    kind: str  # "content" | "reasoning" | "tool_call" | "tool_call_start" | "tool_call_args"
    text: str = ""
    call: ToolCall | None = None
    call_id: str = ""
    logprobs: list[TokenLogprob] | None = None


def tool_call_id() -> str:
    """A fresh OpenAI-style tool-call id (the ledger matches echoes by it)."""
    return "call_" + fresh_hex(8)


def plan_turn(profile: ModelProfile, session: Session, turn: Turn, params: ChatParams) -> Plan:
    """Sync the ledger with the incoming history and build the engine input. Changes nothing:
    what the session's policy decides is carried in the plan and applied at commit."""
    renderer = profile.renderer
    messages, tools, kw = params.messages, params.tools, params.template_kwargs
    if tools and not renderer.renders_tools and not profile.tool_parser_explicit:
        # Answering as if there were no tools would silently change the task: refuse, unless the
        # operator named a tool parser (the agent then describes its tools in its own prompt).
        raise InvalidRequest(
            f"the chat template of {profile.name!r} cannot render tools; serve it with a tool-capable "
            "--chat-template (or name --tool-parser if the agent describes its tools itself)",
            param="tools",
        )
    digest = tools_digest(tools)
    ledger = session.ledger
    if ledger is None or not ledger.capturing:
        ids = renderer.render_prompt(messages, tools, **kw)
        return Plan(np.asarray(ids, dtype=np.int32), ids, False, reasoning_forced=_forced(profile, ids))
    new_on_miss, parent, event = conversation_event(params.event, len(ledger.conversations))
    found = ledger.match(messages, surface=params.surface, tools=digest, new_on_miss=new_on_miss)
    seg, synced = ledger.head(None if found.opens else found.conversation), found.found
    if (
        isinstance(synced, Violation)
        and not found.opens
        and ledger.is_retry(messages, surface=params.surface, tools=digest, conversation=found.conversation)
    ):
        last = seg.turns[-1]
        cause = duplicate_cause(turn, last.committed_at)
        if cause == "retry":
            # The agent lost the reply: generate the turn again from the same prompt.
            ids = seg.ids_view()[: last.start].copy()
            inc = seg.ids[last.prompt_start : last.start].tolist()
            new = messages[last.records_before :]
            return Plan(
                ids,
                inc,
                True,
                new,
                params.surface,
                digest,
                replace_last=True,
                reasoning_forced=_forced(profile, inc),
                history=history_print(messages),
                conversation=found.conversation,
            )
        synced = Violation(cause, len(messages), "the same request arrived while its turn was running")
    plan = Plan(np.zeros(0, dtype=np.int32), [], True, messages, params.surface, digest)
    plan.conversation = found.conversation
    plan.history = history_print(messages) if isinstance(synced, Violation) else synced.history
    if isinstance(synced, Violation):
        if found.opens:
            plan.segment = (synced.cause, synced.detail)
            plan.parent = ledger.active if parent is None else parent
        else:
            decision = decide(session, synced, event)
            if isinstance(decision, str):
                plan.invalidate, plan.recorded = decision, False
            else:
                plan.segment = decision
        ids = renderer.render_prompt(messages, tools, **kw)
        plan.input_ids, plan.increment = np.asarray(ids, dtype=np.int32), ids
    elif (last := seg.last_turn) is None:
        ids = renderer.render_prompt(messages, tools, **kw)
        plan.input_ids, plan.increment = np.asarray(ids, dtype=np.int32), ids
    else:
        assert isinstance(synced, Synced)
        if not synced.new:
            raise InvalidRequest("no new message since the last assistant turn", param="messages")
        anchor = _last_user(messages, len(messages) - len(synced.new))
        inc_ids = renderer.render_continuation(
            synced.new,
            tools,
            previous_ended_with_eos=last.ended_with_stop_token,
            anchor_user=anchor,
            as_array=True,
            **kw,
        )
        plan.input_ids = np.concatenate([seg.ids_view(), inc_ids])
        plan.increment, plan.new_messages = inc_ids, synced.new
        plan.echo_matches, plan.echo_edits = synced.echo_matches, synced.echo_edits
    plan.reasoning_forced = _forced(profile, plan.increment)
    return plan


def conversation_event(event: str | None, conversations: int) -> tuple[bool | None, int | None, str | None]:
    """What an agent-stated event (`X-Rlgw-Event`) says about conversations: whether a request
    that extends none opens a new one (None: the ledger decides), the parent it names, and the
    segment cause left for a rewrite.

    `new_conversation` opens one (its parent: the conversation that spoke last);
    `new_conversation; parent=N` names the parent. Any other value names a rewrite's cause.
    """
    if event is None:
        return None, None, None
    head, _, rest = event.partition(";")
    if head.strip() != Cause.NEW_CONVERSATION:
        return False, None, event
    rest = rest.strip()
    if not rest:
        return True, None, None
    key, _, value = rest.partition("=")
    if key.strip() != "parent" or not value.strip().isdigit() or int(value) >= conversations:
        raise InvalidRequest(
            f"X-Rlgw-Event {event!r}: expected 'new_conversation' or 'new_conversation; parent=N' "
            f"with N one of the session's conversations (0..{conversations - 1})",
            param="X-Rlgw-Event",
        )
    return True, int(value), None


def _last_user(messages: list[dict[str, Any]], end: int) -> dict[str, Any] | None:
    """The last user message before `end`: the increment is rendered after it, as in the history
    (templates such as Qwen3's decide by it which reasoning to keep)."""
    for i in range(end - 1, -1, -1):
        if messages[i].get("role") == "user":
            return messages[i]
    return None


def _forced(profile: ModelProfile, ids: list[int] | np.ndarray) -> bool:
    """Whether the generation prompt already opened a think block (reasoning is forced)."""
    k = len(profile.think_start_ids)
    if k == 0:
        return False
    tail = ids[-k:]
    return tuple(tail.tolist() if isinstance(tail, np.ndarray) else tail) == profile.think_start_ids


class TurnDecoder:
    """Sampled ids -> agent-visible events: detokenize, trim stop strings, parse."""

    def __init__(self, profile: ModelProfile, params: ChatParams, plan: Plan) -> None:
        use_tools = bool(params.tools) and params.tool_choice != "none"
        self.detok = IncrementalDetokenizer(profile.tokenizer, skip_special_tokens=True)
        stops = params.sampling.get("stop") or []
        self.trim = StopTrimmer([stops] if isinstance(stops, str) else list(stops))
        self.parser = OutputParser(
            tool_format=profile.tool_format if use_tools else None,
            tools=params.tools if use_tools else None,
            reasoning=profile.reasoning and params.separate_reasoning,
            reasoning_forced=plan.reasoning_forced,
        )

    def feed(self, ids: list[int]) -> list[ParserEvent]:
        """Events for newly sampled ids."""
        return self.parser.feed(self.trim.feed(self.detok.feed(ids)))

    def close(self, result: GenerationResult) -> list[ParserEvent]:
        """Events for the rest of the text once the generation has finished."""
        tail = self.trim.feed(self.detok.flush()) + self.trim.close(result.finish_reason.get("matched"))
        return self.parser.feed(tail) + self.parser.close()


def token_logprobs(
    profile: ModelProfile, ids: list[int], logprobs: list[float], top: list[list[tuple[float, int]]] | None
) -> list[TokenLogprob]:
    """The agent's view of sampled tokens' logprobs (built only when the agent asks)."""
    tok = profile.tokenizer
    return [
        TokenLogprob(tok.decode([tid]), lp, [(tok.decode([t]), v) for v, t in (top[i] if top else [])])
        for i, (tid, lp) in enumerate(zip(ids, logprobs, strict=True))
    ]


def reasoning_tokens(profile: ModelProfile, parsed: ParsedOutput, ids: list[int]) -> int:
    """Sampled tokens up to and including the one that closed the reasoning (all of them if the
    reasoning never closed; 0 without reasoning)."""
    if not parsed.reasoning_content:
        return 0
    end = profile.think_end_id
    return ids.index(end) + 1 if end is not None and end in ids else len(ids)


def _check_calls(params: ChatParams, parsed: ParsedOutput) -> None:
    # Calls are never dropped (the sampled tokens contain them all); a request that forbade
    # parallel calls, or required one, gets the breach flagged in the sample's metadata.
    if not params.parallel_tool_calls and len(parsed.tool_calls) > 1:
        parsed.errors.append(
            ParseError("parallel_tool_calls_violated", f"{len(parsed.tool_calls)} calls", "")
        )
    choice = params.tool_choice
    if params.tools and (choice == "required" or isinstance(choice, dict)) and not parsed.tool_calls:
        parsed.errors.append(
            ParseError("tool_choice_unmet", f"tool_choice={choice!r} but no call was made", "")
        )


async def _commit(
    profile: ModelProfile,
    turn: Turn,
    plan: Plan,
    result: GenerationResult,
    parsed: ParsedOutput,
    call_ids: list[str],
    response_id: str,
    overridden: dict[str, Any],
    notes: dict[str, list[Any]],
    sampling: dict[str, Any],
) -> None:
    outcome = Outcome(
        response_id=response_id,
        content=parsed.content,
        overridden=overridden,
        sampling=sampling,
        call_ids=call_ids,
        calls=tuple((c.name, canonical_arguments(c.arguments)) for c in parsed.tool_calls),
        parse_errors=[{"kind": e.kind, "detail": e.detail, "raw": e.raw} for e in parsed.errors],
        notes=notes,
        end_of_turn_id=profile.renderer.end_of_turn_id,
    )
    await commit(profile, turn, plan, result, outcome)


class _WhileGenerating:
    """What a non-streamed turn needs that does not depend on the engine's reply, done while the
    engine generates: scheduled (`call_soon`) just before the engine call, it runs at the turn's
    first wait on the engine, once the request is written, so it adds nothing to the turn's
    latency (about 50 us less per turn in bench/gateway.py). What it did not get to (the reply
    came first, or it failed) is done after the reply, as before, where an error surfaces."""

    def __init__(self, profile: ModelProfile, params: ChatParams, plan: Plan) -> None:
        self._profile, self._params, self._plan = profile, params, plan
        self.decoder: TurnDecoder | None = None

    def run(self) -> None:
        try:
            self.decoder = TurnDecoder(self._profile, self._params, self._plan)
            new_records(self._plan)  # the journal row's digests of the new messages
        except Exception:
            self.decoder = None


def _prepare(
    profile: ModelProfile, session: Session, turn: Turn, params: ChatParams
) -> tuple[Plan, dict[str, Any], dict[str, Any]]:
    plan = plan_turn(profile, session, turn, params)
    sampling, overridden = engine_sampling(
        profile, session, params.sampling, params.max_tokens, params.top_logprobs, len(plan.input_ids)
    )
    _constrain_tool_choice(profile, params, plan, sampling)
    return plan, sampling, overridden


# The engine's constraint keys (SGLang's): a turn carries at most one.
_CONSTRAINTS = ("json_schema", "regex", "ebnf", "structural_tag")


def _constrain_tool_choice(
    profile: ModelProfile, params: ChatParams, plan: Plan, sampling: dict[str, Any]
) -> None:
    """A `tool_choice` that promises a call (required, or a named function) becomes the engine's
    `structural_tag` (`parsing.tool_choice_grammar`), as SGLang and vLLM constrain it."""
    grammar = tool_choice_grammar(
        params.tools,
        params.tool_choice,
        tool_format=profile.tool_format,
        parallel=params.parallel_tool_calls,
        reasoning=profile.reasoning,
        reasoning_forced=plan.reasoning_forced,
    )
    if grammar is None:
        return
    if any(key in sampling for key in _CONSTRAINTS):
        raise InvalidRequest(
            "a tool_choice that requires a call is a grammar, and the request already sets one "
            "(response_format, regex or ebnf): use one of them",
            param="tool_choice",
        )
    sampling["structural_tag"] = grammar.source


def _turn_notes(params: ChatParams, sampling: dict[str, Any], response_id: str) -> dict[str, list[Any]]:
    """The request's notes for the sample, plus this turn's response id if a tool_choice grammar
    constrained it: its logprobs are those of the masked distribution, which a trainer's forward
    pass without the grammar does not reproduce."""
    if "structural_tag" not in sampling or params.tool_choice in (None, "auto", "none"):
        return params.notes
    return {**params.notes, CONSTRAINED_NOTE: [response_id]}


async def run_chat(
    backend: ModelBackend, profile: ModelProfile, session: Session, params: ChatParams
) -> ChatTurn:
    """A non-streamed chat turn, committed to the ledger before it returns."""
    async with turn_scope(session, arrived=params.arrived) as turn:
        plan, sampling, overridden = _prepare(profile, session, turn, params)
        early = _WhileGenerating(profile, params, plan)
        asyncio.get_running_loop().call_soon(early.run)
        result = await backend.generate(
            plan.input_ids,
            sampling,
            rid=turn.rid,
            routing_key=session.id,
            routed_from=routed_start(profile, plan),
        )
        decoder = early.decoder or TurnDecoder(profile, params, plan)
        decoder.feed(result.output_ids)
        decoder.close(result)
        parsed = decoder.parser.result()
        _check_calls(params, parsed)
        call_ids = [tool_call_id() for _ in parsed.tool_calls]
        response_id = "chatcmpl-" + fresh_hex()
        notes = _turn_notes(params, sampling, response_id)
        await _commit(profile, turn, plan, result, parsed, call_ids, response_id, overridden, notes, sampling)
    lps = (
        token_logprobs(profile, result.output_ids, result.logprobs, result.top_logprobs)
        if params.logprobs
        else None
    )
    return ChatTurn(
        response_id,
        int(time.time()),
        parsed,
        call_ids,
        result,
        len(plan.input_ids),
        lps,
        reasoning_tokens(profile, parsed, result.output_ids),
    )


async def stream_chat(
    backend: ModelBackend, profile: ModelProfile, session: Session, params: ChatParams
) -> AsyncIterator[ChatStart | ChatDelta | ChatTurn]:
    """A streamed chat turn: yields `ChatStart`, `ChatDelta`s as the engine samples, then the
    committed `ChatTurn` (whose `logprobs` are those no delta carried).

    Everything that can be refused with an HTTP status (bad request, context length, a
    finished session) is raised before the first item: a caller that awaits the first item
    gets those errors while it can still answer with a status. The turn (and the session lock)
    lasts until the generator finishes or is closed; a closed generator is a failed turn.
    """
    async with turn_scope(session, arrived=params.arrived) as turn:
        plan, sampling, overridden = _prepare(profile, session, turn, params)
        response_id = "chatcmpl-" + fresh_hex()
        decoder = TurnDecoder(profile, params, plan)
        call_ids: list[str] = []
        pending: list[TokenLogprob] = []
        created = int(time.time())
        updates = backend.stream(
            plan.input_ids,
            sampling,
            rid=turn.rid,
            routing_key=session.id,
            routed_from=routed_start(profile, plan),
        )
        # The head goes out only once the engine has answered (`first_answer`).
        try:
            answered = await first_answer(updates)
            yield ChatStart(response_id, created)
            result: GenerationResult | None = None
            async for update in answered:
                events = decoder.feed(update.new_ids) if update.new_ids else []
                if params.logprobs and update.new_ids:
                    pending += token_logprobs(profile, update.new_ids, update.new_logprobs, update.new_top)
                if update.result is not None:
                    result = update.result
                    events += decoder.close(result)
                for ev in events:
                    delta = _delta(ev, call_ids)
                    if delta is None:
                        continue
                    if pending:
                        delta.logprobs, pending = pending, []
                    yield delta
        finally:
            await updates.aclose()  # a turn closed early aborts its engine request now
        if result is None:
            raise RuntimeError("the engine stream ended without a result")
        parsed = decoder.parser.result()
        _check_calls(params, parsed)
        notes = _turn_notes(params, sampling, response_id)
        await _commit(profile, turn, plan, result, parsed, call_ids, response_id, overridden, notes, sampling)
    yield ChatTurn(
        response_id,
        created,
        parsed,
        call_ids,
        result,
        len(plan.input_ids),
        pending or None,
        reasoning_tokens(profile, parsed, result.output_ids),
    )


def _delta(ev: ParserEvent, call_ids: list[str]) -> ChatDelta | None:
    if ev.kind in ("content", "reasoning") and ev.text:
        return ChatDelta(ev.kind, ev.text)
    if ev.kind in ("tool_call", "tool_call_start") and ev.call is not None:
        call_ids.append(tool_call_id())
        return ChatDelta(ev.kind, call=ev.call, call_id=call_ids[-1])
    if ev.kind == "tool_call_args" and ev.text:
        return ChatDelta(ev.kind, ev.text, call=ev.call)
    return None
