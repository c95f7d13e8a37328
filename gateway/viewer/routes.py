"""The trajectory viewer: read-only web pages at `/ui` over the trajectory store.

`/ui` lists recent task runs (filterable); `/ui/runs/{cursor}` shows one run: its segments' metadata,
turns, tool calls and parse errors, and every token coloured by kind with a logprob heat scale on
sampled tokens. Tokens are not in the page: the page fetches them in pages from
`/ui/api/samples/{cursor}/tokens` as the reader scrolls, so a 32k-token sample opens as fast as a
short one. Pages are rendered on the server (Jinja2) with one small script; there is no build step.
`/ui/training` charts a training run's receipts when the viewer was given their file
(`viewer_app(receipts=...)`, i.e. `rlgw trajectories view --receipts`); `training.py` reads them.

Access is the trajectory API's: under tenant keys a caller sees only its own tenant's runs. A
browser cannot send a bearer header on navigation, so `/ui/login` keeps the key in an HttpOnly,
SameSite=Strict cookie scoped to `/ui`, read only by these routes (the viewer has no state-changing
route that a forged request could abuse). `rlgw trajectories view` mounts the same router on a store
without a gateway, with a fixed scope (`app.state.viewer_scope`: a tenant, or None for all).

This module owns the routes and the HTML; what is shown is computed by `data.py`, and it only
ever reads from `store.TrajectoryStore`.
"""

from __future__ import annotations

import asyncio
import math
import time
import urllib.parse
from collections import OrderedDict
from pathlib import Path
from typing import Annotated, Any

import jinja2
from fastapi import APIRouter, Request
from fastapi import Path as PathParam
from starlette.exceptions import HTTPException
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response

from rlgw.gateway.errors import APIError, AuthError, InvalidRequest, NotFound
from rlgw.gateway.http.errors import json_response
from rlgw.gateway.parsing.tool_calls import detect_tool_format
from rlgw.gateway.tenancy.tenants import KeyTable, require_tenant
from rlgw.gateway.trajectories.api import MAX_CURSOR
from rlgw.gateway.trajectories.store import StoredSample, TrajectoryStore
from rlgw.gateway.viewer import data as viewer_data
from rlgw.gateway.viewer import training

router = APIRouter()

STATIC_DIR = Path(__file__).parent / "static"
COOKIE = "rlgw_ui_key"
RUNS_PER_PAGE = 50
SCAN_ROWS = 256  # summaries read per store query while grouping runs
MAX_SCAN_ROWS = 20_000  # a filter that matches little stops after this many rows (the page says so)
TOKEN_PAGE = 2048
MAX_TOKEN_PAGE = 8192
_STATIC_FILES = {"viewer.css": "text/css", "viewer.js": "text/javascript"}

_templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(STATIC_DIR), autoescape=True, undefined=jinja2.StrictUndefined
)


class _Denied(Exception):
    """No valid tenant key: HTML routes answer the login form, JSON routes a 401."""


def _scope(request: Request) -> str | None:
    """The tenant whose runs the caller may see (`None`: all tenants, offline viewer only).

    The trajectory API's own check (`require_tenant`: open gateway, or a bearer tenant key) first;
    failing that, the key the login form left in the viewer's cookie.
    """
    state = request.app.state
    if hasattr(state, "viewer_scope"):
        return state.viewer_scope
    try:
        return require_tenant(request)
    except (HTTPException, APIError):
        key = request.cookies.get(COOKIE)
        owner = state.tenant_keys.owner(key) if key else None
        if owner is None:
            raise _Denied from None
        return owner


def _store(request: Request) -> TrajectoryStore:
    return request.app.state.store


def _page(name: str, status: int = 200, **context: Any) -> HTMLResponse:
    return HTMLResponse(_templates.get_template(name).render(**context), status_code=status)


def _login_page(request: Request, error: str = "") -> HTMLResponse:
    return _page("login.html", 401, error=error, next=request.url.path)


# -- the run list ------------------------------------------------------------------------------


async def _recent_runs(
    store: TrajectoryStore, scope: str | None, before: int | None, filters: dict[str, str]
) -> tuple[list[viewer_data.Run], int | None, bool]:
    """Up to RUNS_PER_PAGE runs older than `before` that pass `filters`; the next page's cursor; and
    whether the scan stopped at MAX_SCAN_ROWS."""
    runs: list[viewer_data.Run] = []
    scanned = 0
    pending: list[Any] = []  # newest-first rows of a run that may go on in the next read
    cursor = before
    while True:
        rows = await store.summaries(scope, before=cursor, limit=SCAN_ROWS, newest_first=True)
        scanned += len(rows)
        grouped = list(viewer_data.group_runs(pending + rows))
        exhausted = len(rows) < SCAN_ROWS
        if not exhausted and grouped:
            # The oldest group may have more segments in the next read: carry it over.
            last = grouped.pop()
            pending = last.segments[::-1]
        else:
            pending = []
        for run in grouped:
            if run.matches(**filters):
                runs.append(run)
                if len(runs) == RUNS_PER_PAGE:
                    return runs, run.first.cursor, False
        if exhausted:
            return runs, None, False
        cursor = rows[-1].cursor
        if scanned >= MAX_SCAN_ROWS:
            return runs, pending[0].cursor + 1 if pending else cursor, True


def _run_row(run: viewer_data.Run) -> dict[str, Any]:
    first = run.first
    return {
        "cursor": first.cursor,
        "task_id": first.task_id,
        "session_id": first.session_id,
        # Only capture sessions are stored (eval sessions record nothing).
        "mode": "capture",
        "reward": "-" if first.reward is None else f"{first.reward:g}",
        "status": run.status,
        "segments": len(run.segments),
        "trainable_tokens": run.trainable_tokens,
        "termination_reason": run.termination_reason or "-",
        "weight_versions": " → ".join(run.weight_versions),
        "created": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(first.created_at)),
    }


@router.get("/ui", response_class=HTMLResponse)
async def runs_page(
    request: Request, task: str = "", status: str = "", reason: str = "", before: int | None = None
) -> Response:
    """Recent task runs, newest first, filtered by task, status and termination reason."""
    try:
        scope = _scope(request)
    except _Denied:
        return _login_page(request)
    filters = {"task": task, "status": status, "reason": reason}
    runs, next_before, capped = await _recent_runs(_store(request), scope, before, filters)
    older = None
    if next_before is not None:
        older = "/ui?" + urllib.parse.urlencode(
            {**{k: v for k, v in filters.items() if v}, "before": next_before}
        )
    return _page(
        "runs.html",
        runs=[_run_row(r) for r in runs],
        filters=filters,
        older=older,
        capped=capped,
        statuses=("completed", "truncated", "aborted", "failed"),
        tenant=scope,
        logout=_uses_keys(request),
    )


def _uses_keys(request: Request) -> bool:
    return not hasattr(request.app.state, "viewer_scope") and len(request.app.state.tenant_keys) > 0


# -- one run -----------------------------------------------------------------------------------


class _ViewCache:
    """The last few samples' token views: scrolling a 32k-token sample asks for many pages of one view."""

    def __init__(self, size: int = 8) -> None:
        self._size = size
        self._items: OrderedDict[int, viewer_data.TokenView] = OrderedDict()

    def get(self, cursor: int) -> viewer_data.TokenView | None:
        view = self._items.get(cursor)
        if view is not None:
            self._items.move_to_end(cursor)
        return view

    def put(self, cursor: int, view: viewer_data.TokenView) -> None:
        self._items[cursor] = view
        while len(self._items) > self._size:
            self._items.popitem(last=False)


def _tokenizer(request: Request) -> Any | None:
    state = request.app.state
    if hasattr(state, "viewer_tokenizer"):
        return state.viewer_tokenizer
    profile = getattr(state, "profile", None)
    return profile.tokenizer if profile is not None else None


def _tool_format(request: Request, tokenizer: Any | None) -> str | None:
    profile = getattr(request.app.state, "profile", None)
    if profile is not None:
        return profile.tool_format
    return detect_tool_format(getattr(tokenizer, "chat_template", None)) if tokenizer is not None else None


def _view_cache(request: Request) -> _ViewCache:
    state = request.app.state
    if not hasattr(state, "viewer_cache"):
        state.viewer_cache = _ViewCache()
    return state.viewer_cache


async def _token_view(request: Request, stored: StoredSample) -> viewer_data.TokenView:
    cache = _view_cache(request)
    view = cache.get(stored.cursor)
    if view is None:
        view = await asyncio.to_thread(viewer_data.token_view, stored.sample, _tokenizer(request))
        cache.put(stored.cursor, view)
    return view


async def _run_segments(store: TrajectoryStore, scope: str | None, cursor: int) -> list[Any]:
    """The stored segments of the run whose first segment is at `cursor` (consecutive cursors)."""
    head = await store.summaries(scope, after=cursor - 1, limit=1)
    if not head or head[0].cursor != cursor:
        return []
    # The ledger's segment count bounds the read (rejected segments leave no row); a session finishes
    # once, so no later row can belong to it and the filter below only trims other runs' rows.
    total = int(head[0].metadata.get("segments") or 1)
    rows = await store.summaries(scope, after=cursor - 1, limit=max(total, 16))
    return [r for r in rows if r.session_id == head[0].session_id]


async def _segment(request: Request, scope: str | None, summary: Any) -> dict[str, Any]:
    stored = await _store(request).get(scope, summary.cursor)
    assert stored is not None  # its summary was just read under the same scope
    tokenizer = _tokenizer(request)
    view = await _token_view(request, stored)
    sample = stored.sample
    shown_meta = {
        k: v
        for k, v in sample.metadata.items()
        if k not in ("tool_parse_errors", "engine_rids", "response_ids", "turn_finish")
    }
    turns = viewer_data.turns(
        sample, view.texts if tokenizer is not None else None, _tool_format(request, tokenizer)
    )
    rids = sample.metadata.get("engine_rids") or []
    return {
        "cursor": stored.cursor,
        "segment": stored.segment,
        "status": str(sample.status),
        "reward": "-" if sample.reward is None else f"{sample.reward:g}",
        "cause": sample.metadata.get("segment_cause") or "-",
        "cause_detail": sample.metadata.get("segment_cause_detail") or "",
        "total": len(sample.tokens),
        "prompt_length": sample.prompt_length,
        "response_length": sample.response_length,
        "trainable": int(sample.loss_mask.sum()),
        "weight_versions": [(v.version, v.start, v.end) for v in sample.weight_versions],
        "turns": [
            {
                "index": t.index,
                "start": t.start,
                "end": t.end,
                "finish": t.finish or "-",
                "mean_logprob": f"{t.mean_logprob:.3f}",
                "perplexity": f"{math.exp(-t.mean_logprob):.2f}",
                "calls": t.calls,
                "errors": t.errors,
                "rid": rids[t.index] if t.index < len(rids) else "",
            }
            for t in turns
        ],
        "turn_starts": ",".join(f"{t.start}:{t.index}:{t.finish or ''}" for t in turns),
        "metadata": shown_meta,
    }


@router.get("/ui/runs/{cursor}", response_class=HTMLResponse)
async def run_page(request: Request, cursor: Annotated[int, PathParam(ge=1, le=MAX_CURSOR)]) -> Response:
    """One run: its segments, turns, tool calls, parse errors, metadata, and (lazily) its tokens."""
    try:
        scope = _scope(request)
    except _Denied:
        return _login_page(request)
    summaries = await _run_segments(_store(request), scope, cursor)
    if not summaries:
        # Same page for "absent" and "another tenant's": existence is not leaked across tenants.
        return _page("missing.html", 404, cursor=cursor)
    run = viewer_data.Run(summaries)
    segments = [await _segment(request, scope, s) for s in summaries]
    return _page(
        "run.html",
        run=_run_row(run),
        rollout_id=run.first.rollout_id,
        group_index=run.first.group_index,
        segments=segments,
        has_tokenizer=_tokenizer(request) is not None,
        page_size=TOKEN_PAGE,
        logout=_uses_keys(request),
    )


@router.get("/ui/api/samples/{cursor}/tokens")
async def sample_tokens(
    request: Request,
    cursor: Annotated[int, PathParam(ge=1, le=MAX_CURSOR)],
    start: int = 0,
    count: int = TOKEN_PAGE,
) -> Response:
    """Tokens [start, start+count) of one sample: parallel arrays of text, kind and logprob (JSON)."""
    try:
        scope = _scope(request)
    except _Denied:
        raise AuthError("Invalid or missing tenant API key.") from None
    if start < 0:
        raise InvalidRequest(f"'start' must be >= 0, got {start}.", param="start", code="invalid_parameter")
    if not 1 <= count <= MAX_TOKEN_PAGE:
        raise InvalidRequest(
            f"'count' must be between 1 and {MAX_TOKEN_PAGE}, got {count}.",
            param="count",
            code="invalid_parameter",
        )
    stored = await _store(request).get(scope, cursor)
    if stored is None:
        raise NotFound(f"No trajectory with cursor {cursor}.", param="cursor", code="trajectory_not_found")
    view = await _token_view(request, stored)
    return json_response(200, view.page(start, count), headers={"Cache-Control": "no-store"})


# -- the training page ------------------------------------------------------------------------


def _receipts(request: Request) -> Path | None:
    """The receipts file this viewer was pointed at (`rlgw trajectories view --receipts`), if any."""
    return getattr(request.app.state, "viewer_receipts", None)


def _fmt(v: Any, spec: str) -> str:
    return "-" if not isinstance(v, (int, float)) else format(v, spec)


def _receipt_cells(r: dict[str, Any]) -> list[str]:
    loss, s = r.get("losses") or {}, r.get("seconds") or {}
    served = ",".join((r.get("published") or {}).get("served_versions") or []) or "-"
    return [
        str(r["iteration"]), _fmt(r.get("reward_mean"), ".3f"), _fmt(r.get("rollouts"), "d"),
        _fmt(r.get("trainable_tokens"), "d"), _fmt(r.get("kl"), ".4g"), _fmt(loss.get("clipfrac"), ".3f"),
        _fmt(r.get("is_ratio_mean"), ".4f"), _fmt(r.get("max_staleness"), "d"),
        _fmt(r.get("stale_tokens_masked"), "d"), _fmt(s.get("rollout"), ".1f"), _fmt(s.get("train"), ".1f"),
        _fmt(s.get("sync"), ".1f"), served,
    ]  # fmt: skip


@router.get("/ui/training", response_class=HTMLResponse)
async def training_page(request: Request) -> Response:
    """A training run's receipts as charts (reward, KL, clip fraction, IS ratio, staleness, time split)."""
    try:
        _scope(request)
    except _Denied:
        return _login_page(request)
    path = _receipts(request)
    if path is None:
        return _page("no_training.html", 404, logout=_uses_keys(request))
    common = {"source": str(path), "logout": _uses_keys(request)}
    try:
        receipts = await asyncio.to_thread(training.load_receipts, path)
    except training.ReceiptsError as exc:
        return _page("training.html", 500, error=str(exc), rows=[], charts=[], **common)
    return _page(
        "training.html",
        error="",
        rows=[{"iteration": r["iteration"], "cells": _receipt_cells(r)} for r in receipts],
        charts=training.charts(receipts),
        **training.BOX,
        **common,
    )


@router.get("/ui/api/training")
async def training_series(request: Request) -> Response:
    """The training page's values as JSON: iterations, and each chart's series (null where absent)."""
    try:
        _scope(request)
    except _Denied:
        raise AuthError("Invalid or missing tenant API key.") from None
    path = _receipts(request)
    if path is None:
        raise NotFound("This viewer has no receipts file (rlgw trajectories view --receipts PATH).")
    try:
        receipts = await asyncio.to_thread(training.load_receipts, path)
    except training.ReceiptsError as exc:
        # the viewer's own file is bad, not the request: a server error that says which line
        body = {
            "error": {"message": str(exc), "type": "server_error", "param": None, "code": "invalid_receipts"}
        }
        return json_response(500, body)
    return json_response(200, training.series_json(receipts), headers={"Cache-Control": "no-store"})


# -- login and static files ----------------------------------------------------------------------


@router.post("/ui/login")
async def login(request: Request) -> Response:
    """Check a tenant key from the login form and keep it in the viewer's cookie."""
    form = urllib.parse.parse_qs((await request.body()).decode("utf-8", "replace"))
    key = (form.get("key") or [""])[0].strip()
    target = (form.get("next") or ["/ui"])[0]
    if not target.startswith("/ui"):  # never redirect off the viewer (open-redirect guard)
        target = "/ui"
    table: KeyTable = request.app.state.tenant_keys
    if not key or table.owner(key) is None:
        return _login_page(request, error="That key is not a tenant key of this gateway.")
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        COOKIE, key, httponly=True, samesite="strict", path="/ui", secure=request.url.scheme == "https"
    )
    return response


@router.post("/ui/logout")
async def logout() -> Response:
    """Forget the viewer's cookie."""
    response = RedirectResponse("/ui", status_code=303)
    response.delete_cookie(COOKIE, path="/ui")
    return response


@router.get("/ui/static/{name}")
async def static(name: str) -> Response:
    """The page's stylesheet and script (a fixed list: no path from the URL reaches the disk)."""
    if name not in _STATIC_FILES:
        raise NotFound(f"No static file {name!r}.")
    return FileResponse(STATIC_DIR / name, media_type=_STATIC_FILES[name])


def viewer_app(
    store: TrajectoryStore,
    *,
    scope: str | None = None,
    tokenizer: Any | None = None,
    receipts: Path | None = None,
) -> Any:
    """The viewer alone on a store (`rlgw trajectories view`): no gateway, no engine, no keys.

    `receipts`: a `rlgw train` run's receipts.jsonl, shown at `/ui/training`.
    """
    from fastapi import FastAPI

    from rlgw.gateway.http.errors import install_error_handlers

    app = FastAPI(title="rlgw viewer", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    app.include_router(router)
    app.state.store = store
    app.state.viewer_scope = scope
    app.state.viewer_tokenizer = tokenizer
    app.state.viewer_receipts = receipts
    app.state.tenant_keys = KeyTable()

    @app.get("/")
    async def root() -> Response:
        return RedirectResponse("/ui")

    return app
