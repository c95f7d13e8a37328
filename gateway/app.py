"""The gateway application: configuration, its typed state, start-up, and the FastAPI app.

This is the composition root: it builds every room's parts and hands them to the routes as one
`GatewayState` at `app.state`. Start-up asks the engine what it serves (`/model_info`), loads
that tokenizer and chat template (or the ones named by flags), probes the template, picks the
output parsers, and opens the trajectory store. One pooled engine client per process lives in
the lifespan.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.responses import Response
from starlette.types import ASGIApp

from rlgw.gateway.engine_client.backend import SGLangBackend
from rlgw.gateway.engine_client.vllm_backend import make_backend
from rlgw.gateway.engine_semantics import EngineSemantics
from rlgw.gateway.errors import StartupError, UpstreamError
from rlgw.gateway.http.body_limits import RequestCaps
from rlgw.gateway.http.errors import install_error_handlers, json_response
from rlgw.gateway.ledger.ledger import Policy
from rlgw.gateway.metrics import MeteredBackend
from rlgw.gateway.model.profile import ModelProfile, build_profile
from rlgw.gateway.model.template_probe import ProbeReport, probe_template
from rlgw.gateway.ops import api as ops_api
from rlgw.gateway.serving.edge import Edge
from rlgw.gateway.serving.routing import SESSION_ROUTES
from rlgw.gateway.sessions import api as sessions_api
from rlgw.gateway.sessions.journals import Journal, open_journal
from rlgw.gateway.sessions.table import SessionTable
from rlgw.gateway.surfaces.anthropic import api as anthropic_api
from rlgw.gateway.surfaces.anthropic.translate import MessagesInput, MessagesRequest
from rlgw.gateway.surfaces.chat_completions import api as chat_completions
from rlgw.gateway.surfaces.completions import api as completions
from rlgw.gateway.surfaces.gemini import api as gemini_api
from rlgw.gateway.surfaces.gemini import translate as gemini_translate
from rlgw.gateway.surfaces.openai_chat import ChatCompletionRequest
from rlgw.gateway.surfaces.responses import api as responses_api
from rlgw.gateway.surfaces.responses.translate import ResponsesRequest
from rlgw.gateway.tenancy import admin_api
from rlgw.gateway.tenancy.limits import Limits, LimitTable
from rlgw.gateway.tenancy.store import TenantStore
from rlgw.gateway.tenancy.tenants import KeyTable
from rlgw.gateway.trajectories import api as trajectories_api
from rlgw.gateway.trajectories.backends import Store, open_store
from rlgw.gateway.turns.lifecycle import DEFAULT_MAX_TOKENS
from rlgw.gateway.viewer import routes as viewer
from rlgw.gateway.viewer.routes import ViewerState

log = logging.getLogger(__name__)


@dataclass
class GatewayConfig:
    """Everything `rlgw serve` can set; defaults suit one machine."""

    engine_url: str
    data_dir: Path
    engine_kind: str = "sglang"  # or "vllm" (`engine_client/vllm_backend.py`)
    tokenizer: str | None = None  # default: the engine's tokenizer_path
    chat_template: str | None = None  # a Jinja file (or text) overriding the tokenizer's template
    tool_parser: str = "auto"
    reasoning_parser: str = "auto"
    context_length: int | None = None  # default: from the engine or the model config
    default_max_tokens: int | None = DEFAULT_MAX_TOKENS  # a turn's output cap when it names none
    tenant_keys: dict[str, str] = field(default_factory=dict)  # key -> tenant name
    public_url: str | None = None  # base URL agents reach this gateway at
    default_policy: Policy = Policy.SEGMENT
    served_model_name: str | None = None
    engine_wait: float = 600.0  # seconds to wait for the engine at start-up
    session_ttl: float = 6 * 3600.0  # forget sessions idle this long (nothing is stored for them)
    # The session journal's durability: "normal" survives a killed process, "full" power loss too.
    journal_sync: str = "normal"
    # Where samples and the journal live: a `postgresql://` URL shares them between gateways;
    # None keeps them in `data_dir` (SQLite and local files).
    store: str | None = None
    journal: str | None = None
    # Start even when the template probe finds that increments differ from full renders.
    allow_template_mismatch: bool = False
    admin_key: str | None = None  # manages tenants (/admin/tenants); from env or a file, never argv
    default_limits: Limits = field(default_factory=Limits)  # per tenant, unless the tenant has its own
    request_caps: RequestCaps = field(default_factory=RequestCaps)


@dataclass
class GatewayState:
    """Everything the routes read, at `request.app.state`: one typed object the composition root
    sets (no attribute is added or probed later).

    The tables exist from `create_app` on; the parts that need the engine or the data directory
    (the fields without a value here) are set by start-up, before the first request is served.
    """

    sessions: SessionTable
    tenant_keys: KeyTable  # tenant keys and the admin key
    limits: LimitTable  # per-tenant limits
    request_caps: RequestCaps
    public_url: str | None  # base URL agents reach this gateway at (None: the request's own)
    default_policy: Policy
    template_mismatch_allowed: bool
    # Set by start-up:
    backend: MeteredBackend = field(init=False)
    profile: ModelProfile = field(init=False)
    vocab_size: int = field(init=False)
    probe: ProbeReport = field(init=False)
    store: Store = field(init=False)
    tenant_store: TenantStore = field(init=False)
    viewer: ViewerState = field(init=False)

    @classmethod
    def of(cls, config: GatewayConfig, journal: Journal) -> GatewayState:
        """The state before start-up: the session, key and limit tables, from `config`."""
        keys = KeyTable()
        for key, tenant in config.tenant_keys.items():
            keys.add(key, tenant)
        keys.set_admin_key(config.admin_key)
        return cls(
            sessions=SessionTable(journal),
            tenant_keys=keys,
            limits=LimitTable(config.default_limits),
            request_caps=config.request_caps,
            public_url=config.public_url.rstrip("/") if config.public_url else None,
            default_policy=config.default_policy,
            template_mismatch_allowed=config.allow_template_mismatch,
        )


async def _engine_info(backend: SGLangBackend, wait: float) -> dict[str, Any]:
    deadline = time.monotonic() + wait
    while True:
        try:
            return await backend.model_info()
        except UpstreamError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def load_model(backend: SGLangBackend, config: GatewayConfig) -> tuple[ModelProfile, ProbeReport]:
    """Start-up, step 2: what the engine serves, its tokenizer and template, and the template probe
    (a template that cannot be rendered incrementally stops start-up unless allowed)."""
    info = await _engine_info(backend, config.engine_wait)
    _warn_if_seeds_ignored(backend.semantics)
    profile = await asyncio.to_thread(
        functools.partial(
            build_profile,
            info,
            tokenizer=config.tokenizer,
            chat_template=config.chat_template,
            tool_parser=config.tool_parser,
            reasoning_parser=config.reasoning_parser,
            context_length=config.context_length,
            served_model_name=config.served_model_name,
        )
    )
    profile.default_max_tokens = config.default_max_tokens
    report = probe_template(profile.renderer)
    if not report.increment_matches_full_render and not config.allow_template_mismatch:
        raise StartupError(
            "the chat template cannot be rendered incrementally without changing what the model "
            f"would see ({report.summary()}); fix the template (--chat-template) or start with "
            "--allow-template-mismatch"
        )
    return profile, report


def _warn_if_seeds_ignored(semantics: EngineSemantics | None) -> None:
    """Tell the user at start-up when the engine will not honour seeds (the samples say so too)."""
    reason = semantics.not_repeatable_reason() if semantics is not None else None
    if reason:
        log.warning("the engine ignores sampling seeds", extra={"fields": {"reason": reason}})


def freeze_heap() -> None:
    """Start-up, step 3: keep what lives as long as the process out of the cyclic collector."""
    # Everything loaded so far (tokenizer, template, modules) lives as long as the process:
    # keep it out of the cyclic collector's generations so collections stay cheap.
    gc.freeze()
    # A turn's parsed request is thousands of objects freed by reference counting; at the
    # default threshold (700) hundreds of turns in flight were scanned and promoted again
    # and again (256-session load in bench/gateway.py on a busy machine: 508 and 596 turns/s
    # at the default, 571 and 612 with this).
    gc.set_threshold(50_000, 50, 100)


async def restore_sessions(state: GatewayState, journal: Journal) -> None:
    """Start-up, step 4: the journal's open sessions back in the table (those stored are done)."""
    finished = await state.store.stored_sessions(journal.session_ids())
    restored = state.sessions.restore_all(finished)
    if restored:
        log.info("sessions restored from the journal", extra={"fields": {"sessions": restored}})


async def _sweep_sessions(sessions: SessionTable, ttl: float) -> None:
    """Forget sessions idle longer than `ttl`: an agent that died must not hold memory forever."""
    while True:
        await asyncio.sleep(min(60.0, ttl / 4))
        for session in sessions.expired(ttl):
            sessions.remove(session.id)
            if sessions.journal is not None:
                await sessions.journal.closed(session.id)
            log.warning(
                "idle session dropped",
                extra={
                    "fields": {"session": session.id, "task": session.task_id, "finished": session.finished}
                },
            )


def _log_ready(config: GatewayConfig, profile: ModelProfile, report: ProbeReport) -> None:
    log.info(
        "gateway ready",
        extra={
            "fields": {
                "engine": config.engine_url,
                "model": profile.name,
                "context_length": profile.context_length,
                "tool_format": profile.tool_format,
                "reasoning": profile.reasoning,
                "template": report.summary(),
                "data_dir": str(config.data_dir),
            }
        },
    )


class _EdgeFirst(FastAPI):
    """FastAPI with `Edge` outside its whole middleware stack rather than among the user
    middlewares: a turn the edge serves skips FastAPI's server-error, exception-telemetry and
    body-limit layers and the `send` wrapper of the first (about 50 us of CPU a turn in
    bench/gateway.py's loop, measured with the edge inside and outside). An
    exception no handler answers reaches the server, which answers 500 and logs it, as the
    server-error layer did; every other request still passes that layer, inside the edge."""

    edge: dict[str, Any]  # Edge's keyword arguments, set before the first request

    def build_middleware_stack(self) -> ASGIApp:
        return Edge(super().build_middleware_stack(), **self.edge)


def create_app(config: GatewayConfig) -> FastAPI:
    """The gateway as an ASGI app; start-up needs the engine to answer `/model_info`."""
    journal = open_journal(config.journal, config.data_dir, sync=config.journal_sync)
    state = GatewayState.of(config, journal)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Step 1: the engine client and the stores (closed whatever happens next).
        state.backend = MeteredBackend(make_backend(config.engine_kind, config.engine_url))
        state.store = open_store(config.store, config.data_dir)
        state.tenant_store = TenantStore.open(config.data_dir)
        try:
            admin_api.apply_tenants(state.tenant_store, state.tenant_keys, state.limits)
            state.profile, state.probe = await load_model(state.backend, config)  # step 2
            state.vocab_size = state.profile.vocab_size
            state.viewer = ViewerState(
                state.store, state.tenant_keys, state.profile.tokenizer, state.profile.tool_format
            )
            _log_ready(config, state.profile, state.probe)
            freeze_heap()  # step 3
            await restore_sessions(state, journal)  # step 4
            # Step 5: the background loops, for as long as the app serves.
            loops = [
                asyncio.create_task(_sweep_sessions(state.sessions, config.session_ttl)),
                asyncio.create_task(admin_api.sync_loop(app)),
            ]
            yield
            for task in loops:
                task.cancel()
        finally:
            await state.backend.aclose()
            await state.store.close()
            state.tenant_store.close()
            journal.close()

    app = _EdgeFirst(title="rlgw", lifespan=lifespan)
    app.state = state  # type: ignore[assignment]  # the routes' one typed state
    install_error_handlers(app)
    # The one middleware: meter, body cap and limits for every request, and the turn routes.
    app.edge = {
        "table": state.limits,
        "max_body_bytes": config.request_caps.max_body_bytes,
        "routes": SESSION_ROUTES,
    }
    for module in (
        chat_completions,
        completions,
        sessions_api,
        trajectories_api,
        admin_api,
        ops_api,
        anthropic_api,
        responses_api,
        gemini_api,
        viewer,
    ):
        app.include_router(module.router)

    @app.get("/v1/gateway/info")
    async def info() -> Response:
        """What the gateway serves and what its template probe found."""
        p = state.profile
        return json_response(
            200,
            {
                "model": p.name,
                "engine_url": config.engine_url,
                "context_length": p.context_length,
                "tool_format": p.tool_format,
                "reasoning": p.reasoning,
                "template_probe": state.probe.summary(),
            },
        )

    return app


# The turn routes read their JSON body themselves (the edge serves them without FastAPI's
# router), so FastAPI's document names no body for them: these are their request models, by the
# path suffix every form of the route (`/v1/...`, `/s/{session_id}/v1/...`) ends with.
TURN_BODIES: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": completions.CompletionRequest,
    "/v1/messages": MessagesRequest,
    "/v1/messages/count_tokens": MessagesInput,
    "/v1/responses": ResponsesRequest,
    **{
        f"/{version}/models/{{model}}:{method}": gemini_translate.GenerateContentRequest
        for version in ("v1", "v1beta")
        for method in ("generateContent", "streamGenerateContent", "countTokens")
    },
}


def openapi_document(doc: dict[str, Any]) -> dict[str, Any]:
    """The gateway's OpenAPI document (`/openapi.json`'s) with each turn route's request body added.

    Used by the API reference (docs/gen/http_api.py) and the schema-driven fuzz test.
    """
    _, defs = models_json_schema(
        [(m, "validation") for m in TURN_BODIES.values()], ref_template="#/components/schemas/{model}"
    )
    doc.setdefault("components", {}).setdefault("schemas", {}).update(defs["$defs"])
    for path, ops in doc["paths"].items():
        model = next((m for suffix, m in TURN_BODIES.items() if path.endswith(suffix)), None)
        if model is not None and "post" in ops:
            ref = {"$ref": f"#/components/schemas/{model.__name__}"}
            ops["post"]["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref}}}
    return doc
