"""One task run through a capture session, and the samples the gateway stored for it.

`run_rollout(gw, runner, request)` is the single path every trainer adapter takes: a runner opens
a capture session on the gateway, runs the task (an rlgw scaffold through `InstalledAgent`, or an
agent function such as `ChatLoop` or the user's own, given the session's base URL), finishes the
session with the verifier's reward, and the stored samples are read back by their cursors. What a
trainer gets is therefore exactly what the store holds: this module never sees an engine, a
template or a token it did not read from the store. It knows nothing about any trainer's types.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import traceback
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from rlgw.gateway.trajectories.client import (
    GatewayClient,
    GatewayClientError,
    RejectedSegment,
    RolloutStoredError,
    SessionInfo,
    StoredTrajectory,
)

if TYPE_CHECKING:
    from rlgw.sandboxes.factory import SandboxSpec

log = logging.getLogger(__name__)

# The session sampling keys the gateway accepts (gateway/sessions_api.py), and SGLang's name for
# the one trainers spell differently. Other engine knobs a trainer passes (skip_special_tokens,
# no_stop_trim, logprobs, ...) have no session meaning: rlgw always returns logprobs.
SESSION_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "stop", "presence_penalty")
_RENAMED = {"max_new_tokens": "max_tokens"}


def session_sampling(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """A trainer's SGLang/vLLM sampling params as a session's `sampling` (unknown keys left out)."""
    out: dict[str, Any] = {}
    for key, value in (params or {}).items():
        key = _RENAMED.get(key, key)
        if key in SESSION_SAMPLING_KEYS and value is not None:
            out[key] = value
    return out


class RolloutFailed(RuntimeError):
    """A task run left no usable samples (the agent or the infrastructure failed); `rollout` says why."""

    def __init__(self, rollout: Rollout) -> None:
        super().__init__(
            f"rollout {rollout.request.rollout_id} of task {rollout.request.task_id}: {rollout.error}"
        )
        self.rollout = rollout


@dataclass(frozen=True, slots=True)
class TaskRequest:
    """One run to do and how its samples are named.

    `prompt`: the first user message (a string) or the opening messages (OpenAI dicts).
    `task`: an rlgw task document (`rlgw.scaffolds.tasks`: id, instruction, setup_files,
    verifier), needed by scaffold runs; without one a scaffold gets `prompt` as its instruction.
    `sampling`: the session's sampling (`session_sampling` converts a trainer's params).
    """

    task_id: str
    rollout_id: str
    prompt: str | list[dict[str, Any]] = ""
    group_index: int = 0
    sampling: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    task: dict[str, Any] | None = None

    def messages(self) -> list[dict[str, Any]]:
        """The opening messages (a string prompt becomes one user message)."""
        if isinstance(self.prompt, str):
            return [{"role": "user", "content": self.prompt}]
        return [dict(m) for m in self.prompt]


@dataclass(slots=True)
class Rollout:
    """What one task run left in the store: its samples in segment order, reward, and any failure.

    `error` is set when the run failed (the agent raised, a scaffold stage failed, or nothing was
    stored); the samples of a failed run, if any, are still listed, with the status they were
    stored with.
    """

    request: TaskRequest
    samples: list[StoredTrajectory]
    reward: float | None
    session_id: str | None = None
    termination: str | None = None
    error: str | None = None
    rejects: list[RejectedSegment] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """The run ended without failure and stored at least one sample."""
        return self.error is None and bool(self.samples)

    def raise_for_failure(self) -> Rollout:
        """`self` if ok, else `RolloutFailed` (for trainers with no status to carry a failure)."""
        if not self.ok:
            raise RolloutFailed(self)
        return self


@dataclass(slots=True)
class RunOutcome:
    """What a runner reports: the finished session's stored cursors, reward and how it ended."""

    session_id: str | None
    cursors: list[int]
    reward: float | None
    termination: str | None = None
    error: str | None = None
    rejects: list[RejectedSegment] = field(default_factory=list)


class TaskRunner(Protocol):
    """Runs one task through a capture session on `gw` and finishes it (never leaves it open)."""

    async def __call__(self, gw: GatewayClient, request: TaskRequest) -> RunOutcome: ...


AgentFunction = Callable[[SessionInfo, TaskRequest], Awaitable[float | None]]
"""The user's agent: talks to `session.base_url` with `session.api_key` as an OpenAI (or Anthropic)
endpoint, and returns the verifier's reward (None: no reward)."""


@dataclass(frozen=True, slots=True)
class AgentRunner:
    """Runs an `AgentFunction` (yours, or `ChatLoop`) in a capture session, then finishes it.

    If the agent raises, the session is finished as failed with reward 0.0 and the error in its
    metadata, and the outcome names the error. A request whose rollout id already has a stored
    finish (a trainer's retry after a lost answer) gets that finish's outcome; the agent does not run.
    """

    agent: AgentFunction

    async def __call__(self, gw: GatewayClient, request: TaskRequest) -> RunOutcome:
        try:
            session = await gw.create_session(
                request.task_id,
                rollout_id=request.rollout_id,
                group_index=request.group_index,
                metadata=request.metadata or None,
                sampling=request.sampling or None,
            )
        except RolloutStoredError as stored:
            return _stored_outcome(stored)
        error: str | None = None
        try:
            reward = await self.agent(session, request)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.warning(
                "agent failed",
                extra={
                    "fields": {
                        "task": request.task_id,
                        "rollout": request.rollout_id,
                        "error": error,
                        "tb": "".join(traceback.format_exception(exc))[-2000:],
                    }
                },
            )
        if error is None:
            finish: dict[str, Any] = {"reward": reward, "termination_reason": "finish"}
        else:
            finish = {
                "reward": 0.0,
                "status": "failed",
                "termination_reason": "error",
                "metadata": {"error": error[:500]},
            }
        try:
            summary = await gw.finish_session(session.session_id, **finish)
        except RolloutStoredError as stored:
            # Another live attempt of this rollout stored it first: report that run, drop this one.
            with contextlib.suppress(GatewayClientError):
                await gw.delete_session(session.session_id)
            return _stored_outcome(stored)
        cursors = [s.cursor for s in summary.samples]
        if error is None:
            return RunOutcome(session.session_id, cursors, reward, "finish", None, summary.rejects)
        return RunOutcome(session.session_id, cursors, 0.0, "error", error, summary.rejects)


def _stored_outcome(stored: RolloutStoredError) -> RunOutcome:
    """The outcome of the rollout's run whose finish the gateway already stored."""
    s = stored.summary
    cursors = [x.cursor for x in s.samples]
    return RunOutcome(s.session_id, cursors, s.reward, s.termination_reason, None, s.rejects)


@dataclass(frozen=True, slots=True)
class ScaffoldRunner:
    """Runs an installed rlgw scaffold (rlgw-mini, Terminus-2, OpenHands) through `InstalledAgent`.

    The scaffold's own lifecycle opens the session, runs the agent in a sandbox, grades the frozen
    workspace with the task's verifier and finishes the session with that reward.
    """

    scaffold: str
    scaffold_options: Mapping[str, Any] = field(default_factory=dict)
    max_turns: int = 10
    agent_timeout_s: float = 1800.0
    model: str = "policy"
    sandbox: SandboxSpec | None = None  # None: the local sandbox

    async def __call__(self, gw: GatewayClient, request: TaskRequest) -> RunOutcome:
        from rlgw.sandboxes.factory import SandboxSpec
        from rlgw.scaffolds.agent import AgentConfig, InstalledAgent
        from rlgw.scaffolds.registry import build_scaffold
        from rlgw.scaffolds.tasks import Task

        doc = request.task or {"id": request.task_id, "instruction": _instruction(request)}
        task = Task.from_dict({**doc, "metadata": {**(doc.get("metadata") or {}), **request.metadata}})
        config = AgentConfig(
            mode="capture",
            model=self.model,
            max_turns=self.max_turns,
            agent_timeout_s=self.agent_timeout_s,
            sampling=request.sampling or None,
        )
        agent = InstalledAgent(
            build_scaffold(self.scaffold, dict(self.scaffold_options)),
            (self.sandbox or SandboxSpec()).create,
            gw,
            config,
        )
        result = await agent.run(task, rollout_id=request.rollout_id, group_index=request.group_index)
        rejects = [RejectedSegment(r["segment"], r["reason"], r["detail"]) for r in result.rejects]
        return RunOutcome(
            result.session_id,
            [s["cursor"] for s in result.samples],
            result.reward,
            None if result.termination is None else str(result.termination),
            result.error if result.failed_stage else None,
            rejects,
        )


def _instruction(request: TaskRequest) -> str:
    if isinstance(request.prompt, str):
        return request.prompt
    users = [m.get("content") for m in request.prompt if m.get("role") == "user"]
    if not users or not isinstance(users[-1], str):
        raise ValueError(f"task {request.task_id}: a scaffold needs a task document or a text prompt")
    return users[-1]


def provenance(stored: StoredTrajectory) -> dict[str, Any]:
    """Where a trainer's row came from: its cursor, session, segment, rollout, group, status, versions."""
    s = stored.sample
    return {
        "cursor": stored.cursor,
        "session_id": stored.session_id,
        "segment": stored.segment,
        "rollout_id": s.rollout_id,
        "group_index": s.group_index,
        "status": str(s.status),
        "weight_versions": [v.version for v in s.weight_versions],
    }


async def run_rollout(gw: GatewayClient, runner: TaskRunner, request: TaskRequest) -> Rollout:
    """Run `request` with `runner` and read back every sample the gateway stored for it."""
    outcome = await runner(gw, request)
    stored = await asyncio.gather(*(gw.get_trajectory(c) for c in outcome.cursors))
    samples = sorted(stored, key=lambda t: t.segment)
    error = outcome.error
    if error is None and not samples:
        reasons = "; ".join(f"segment {r.segment}: {r.reason} ({r.detail})" for r in outcome.rejects)
        error = f"no sample stored ({reasons or 'the agent made no model call'})"
    return Rollout(
        request, samples, outcome.reward, outcome.session_id, outcome.termination, error, outcome.rejects
    )


ToolHandler = Callable[[dict[str, Any]], str | Awaitable[str]]
RewardFunction = Callable[[list[dict[str, Any]], TaskRequest], float | Awaitable[float | None] | None]


@dataclass(frozen=True, slots=True)
class ChatLoop:
    """A plain chat loop as an `AgentFunction`: the `openai` SDK against the session's base URL.

    Each turn sends the conversation; tool calls are answered by `handlers` (name -> function of
    the parsed arguments, returning the tool message's text); the loop ends on a reply without
    tool calls or after `max_turns`. `reward` grades the final conversation (None: no reward).
    An unknown tool name or invalid arguments raise: the run fails rather than teaching the model
    on a made-up observation.
    """

    tools: list[dict[str, Any]] | None = None
    handlers: Mapping[str, ToolHandler] = field(default_factory=dict)
    reward: RewardFunction | None = None
    max_turns: int = 8
    chat_template_kwargs: dict[str, Any] | None = None

    async def __call__(self, session: SessionInfo, request: TaskRequest) -> float | None:
        import openai
        import orjson

        messages = request.messages()
        extra = {"chat_template_kwargs": self.chat_template_kwargs} if self.chat_template_kwargs else None
        tools = {"tools": self.tools} if self.tools else {}
        async with openai.AsyncOpenAI(
            base_url=session.base_url, api_key=session.api_key, max_retries=0
        ) as sdk:
            for _ in range(self.max_turns):
                reply = await sdk.chat.completions.create(
                    model="policy", messages=messages, extra_body=extra, **tools
                )
                msg = reply.choices[0].message
                messages.append(msg.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))
                if not msg.tool_calls:
                    break
                for call in msg.tool_calls:
                    handler = self.handlers.get(call.function.name)
                    if handler is None:
                        raise ValueError(f"the model called unknown tool {call.function.name!r}")
                    out = handler(orjson.loads(call.function.arguments))
                    text = await out if asyncio.iscoroutine(out) else out
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
        if self.reward is None:
            return None
        value = self.reward(messages, request)
        return await value if asyncio.iscoroutine(value) else value  # type: ignore[return-value]


_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str | None], GatewayClient]]
_CLIENTS = weakref.WeakKeyDictionary()


def shared_client(url: str, key: str | None) -> GatewayClient:
    """One `GatewayClient` (one connection pool) per gateway and event loop, for hooks called per sample."""
    per_loop = _CLIENTS.setdefault(asyncio.get_running_loop(), {})
    client = per_loop.get((url, key))
    if client is None:
        client = per_loop[(url, key)] = GatewayClient(url, key)
    return client
