"""The engine client: token-in/token-out generation over SGLang's native HTTP protocol.

`ModelBackend` is the shape the gateway needs from an engine; `SGLangBackend` implements it
over `/generate` for a real SGLang server, `sglang-router`, or rlgw's embedded engine (they
speak the same protocol). This module owns the client's policy: request ids, router affinity,
retry-before-output, abort on cancellation, error mapping, and version-robust reading of
SGLang's replies. It knows nothing about chat, sessions or ledgers.

The HTTP I/O sits behind a `Transport` (`transport.py`): aiohttp in production (measured here
about 1 ms per call cheaper than httpx), an in-process handler in tests. Retries, abort on
cancellation and error mapping are this module's, whatever the transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import orjson

from rlgw.gateway.engine_client.http1_transport import Http1Transport
from rlgw.gateway.engine_client.ids_json import IdsJsonCache
from rlgw.gateway.engine_client.transport import (
    AiohttpTransport,
    ConnectFailed,
    ReadTimeout,
    Reply,
    Transport,
    TransportError,
)
from rlgw.gateway.engine_semantics import EngineSemantics, sglang_semantics
from rlgw.gateway.errors import (
    InvalidRequest,
    StartupError,
    UpstreamAborted,
    UpstreamError,
    UpstreamOverloaded,
    UpstreamTimeout,
    UpstreamUnreached,
)
from rlgw.gateway.ids import fresh_hex

log = logging.getLogger(__name__)

ROUTING_HEADER = "X-SMG-Routing-Key"


@dataclass(slots=True)
class GenerationResult:
    """One finished generation, as the engine sampled it.

    `output_ids` includes the stop token when one was matched; `logprobs[i]` is the engine's
    logprob of `output_ids[i]`. `finish_reason` is SGLang's object (`{"type": "stop", ...}`).
    """

    rid: str
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: dict[str, Any]
    weight_version: str
    prompt_tokens: int
    cached_tokens: int = 0
    top_logprobs: list[list[tuple[float, int]]] | None = None
    # SGLang may report that the weights changed mid-generation: (version, start, end) over output_ids.
    version_spans: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def finish_type(self) -> str:
        """`stop`, `length` or `abort`."""
        return str(self.finish_reason.get("type", "stop"))


@dataclass(slots=True)
class StreamUpdate:
    """Output ids (and their logprobs) that arrived since the previous update; `result` is set on
    the last one. `new_top` holds the top logprobs of the new ids when they were asked for."""

    new_ids: list[int]
    result: GenerationResult | None = None
    new_logprobs: list[float] = field(default_factory=list)
    new_top: list[list[tuple[float, int]]] | None = None


class ModelBackend(Protocol):
    """What the gateway needs from an engine: generate from token ids, stream, abort, describe."""

    async def generate(
        self, input_ids: Sequence[int] | np.ndarray, sampling: dict[str, Any], *, rid: str, routing_key: str
    ) -> GenerationResult: ...

    def stream(
        self, input_ids: Sequence[int] | np.ndarray, sampling: dict[str, Any], *, rid: str, routing_key: str
    ) -> AsyncIterator[StreamUpdate]: ...

    async def abort(self, rid: str) -> None: ...

    async def model_info(self) -> dict[str, Any]: ...


def new_rid() -> str:
    """A fresh engine request id."""
    return fresh_hex()


def _parse_result(doc: dict[str, Any], rid: str, top_logprobs_num: int) -> GenerationResult:
    meta = doc.get("meta_info") or {}
    triples = meta.get("output_token_logprobs")
    if triples is None:
        raise UpstreamError("engine reply has no output_token_logprobs: was return_logprob ignored?")
    ids = [int(t[1]) for t in triples]
    logprobs = [float(t[0]) if t[0] is not None else float("nan") for t in triples]
    top = None
    if top_logprobs_num and meta.get("output_top_logprobs") is not None:
        top = [[(float(e[0]), int(e[1])) for e in (row or [])] for row in meta["output_top_logprobs"]]
    spans = [(str(s["version"]), int(s["start"]), int(s["end"])) for s in (meta.get("weight_versions") or [])]
    return GenerationResult(
        rid=str(meta.get("id", rid)),
        output_ids=ids,
        logprobs=logprobs,
        finish_reason=meta.get("finish_reason") or {"type": "stop"},
        weight_version=str(meta.get("weight_version", "default")),
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
        cached_tokens=int(meta.get("cached_tokens", 0)),
        top_logprobs=top,
        version_spans=spans,
    )


def _error_message(body: bytes) -> str:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode(errors="replace")[:500]
    err = doc.get("error", doc) if isinstance(doc, dict) else doc
    if isinstance(err, dict):
        return str(err.get("message", err))
    return str(err)


class SGLangBackend:
    """`ModelBackend` over SGLang's `/generate`; the HTTP I/O is its `Transport`'s.

    - every request carries a rid and `X-SMG-Routing-Key: <session>` so a router keeps a
      session on one engine (prefix cache hits);
    - a request that never reached the engine (no connection, or 503 queue full) is retried
      with backoff; one that may have reached it never is, so a generation is never silently
      duplicated;
    - a cancelled call (the agent disconnected, the session was deleted) aborts its rid;
    - transport failures become `UpstreamError` (502), `UpstreamTimeout` (504) and
      `UpstreamOverloaded` (503), so callers catch them by type.
    """

    # How the engine's logprobs were normalized and whether it honours seeds: set by `model_info`
    # at start-up, copied into every sample's metadata as `engine`.
    semantics: EngineSemantics | None = None

    def __init__(
        self,
        base_url: str,
        *,
        transport: Transport | None = None,
        request_timeout: float = 600.0,
        connect_timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.2,
        api_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # Plain HTTP (the engine beside the gateway) through the lean HTTP/1.1 client; TLS through aiohttp.
        default = Http1Transport if self.base_url.startswith("http://") else AiohttpTransport
        self._transport = transport or default(
            self.base_url, request_timeout=request_timeout, connect_timeout=connect_timeout, headers=headers
        )
        self._retries, self._backoff = retries, backoff  # retries and the first wait (doubling)
        self._ids_json = IdsJsonCache()

    async def aclose(self) -> None:
        """Close the transport's connections."""
        await self._transport.aclose()

    def _payload(
        self,
        input_ids: Sequence[int] | np.ndarray,
        sampling: dict[str, Any],
        rid: str,
        stream: bool,
        key: str,
    ) -> tuple[bytes, int]:
        """The `/generate` body, and the top-logprobs count (a request field, not a sampling one).

        The ids of a session's turn reuse the JSON text of its last turn's ids (`ids_json.py`).
        """
        sampling = dict(sampling)
        top_n = int(sampling.pop("top_logprobs_num", 0) or 0)
        rest: dict[str, Any] = {
            "sampling_params": sampling,
            "rid": rid,
            "return_logprob": True,
            "stream": stream,
        }
        if top_n:
            rest["top_logprobs_num"] = top_n
        if isinstance(input_ids, np.ndarray) and input_ids.dtype == np.int32 and input_ids.ndim == 1:
            ids = self._ids_json.encode(key, np.ascontiguousarray(input_ids))
        else:
            ids = orjson.dumps(input_ids, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
        # orjson would write {"input_ids": [...], <rest>} in this order: the same bytes.
        return b"".join((b'{"input_ids":[', ids, b"],", orjson.dumps(rest)[1:])), top_n

    async def _post(self, path: str, payload: bytes, routing_key: str, *, idempotent: bool = False) -> Reply:
        """POST with retries; a 200 reply.

        Retried: a request that cannot have reached the engine (no connection was made) and a 503
        (the engine's queue is full). An `idempotent` request, whose repeat changes nothing (a
        teacher's force-decode), is also retried after a failure that may have reached the engine:
        a broken connection, a timeout, any 5xx. A 4xx is never retried.
        """
        delay = self._backoff
        headers = {"Content-Type": "application/json", ROUTING_HEADER: routing_key}
        for attempt in range(self._retries + 1):
            last = attempt == self._retries
            try:
                with _upstream_errors(self.base_url):
                    reply = await self._transport.request("POST", path, payload, headers)
            except UpstreamUnreached:
                if last:
                    raise
            except UpstreamError:
                if last or not idempotent:
                    raise
            else:
                if reply.status == 200:
                    return reply
                with _upstream_errors(self.base_url):
                    message = _error_message(await reply.read())
                if (reply.status == 503 or (idempotent and reply.status >= 500)) and not last:
                    log.warning(
                        "engine busy; retrying",
                        extra={"fields": {"status": reply.status, "attempt": attempt}},
                    )
                elif 400 <= reply.status < 500:
                    raise InvalidRequest(f"engine rejected the request: {message}")
                elif reply.status == 503:
                    raise UpstreamOverloaded(f"engine answered 503: {message}")
                else:
                    raise UpstreamError(f"engine answered {reply.status}: {message}")
            await asyncio.sleep(delay)
            delay *= 2
        raise UpstreamError("unreachable")  # pragma: no cover - the loop always returns or raises

    async def post_json(
        self, path: str, payload: bytes, *, routing_key: str, idempotent: bool = False
    ) -> Any:
        """POST a JSON body under this client's retries (`_post`) and return the 200 reply's JSON."""
        reply = await self._post(path, payload, routing_key, idempotent=idempotent)
        with _upstream_errors(self.base_url):
            return orjson.loads(await reply.read())

    async def generate(
        self, input_ids: Sequence[int] | np.ndarray, sampling: dict[str, Any], *, rid: str, routing_key: str
    ) -> GenerationResult:
        """Generate from `input_ids` and return the sampled ids and their logprobs."""
        payload, top_n = self._payload(input_ids, sampling, rid, False, routing_key)
        try:
            reply = await self._post("/generate", payload, routing_key)
            with _upstream_errors(self.base_url):
                doc = orjson.loads(await reply.read())
        except BaseException:
            # Cancelled (the agent went away) or failed mid-read: the engine may still be busy.
            await self._abort_quietly(rid)
            raise
        if isinstance(doc, list):
            doc = doc[0]
        result = _parse_result(doc, rid, top_n)
        _raise_if_aborted(result)
        return result

    async def stream(
        self, input_ids: Sequence[int] | np.ndarray, sampling: dict[str, Any], *, rid: str, routing_key: str
    ) -> AsyncIterator[StreamUpdate]:
        """Stream a generation: yields new ids as the engine produces them, then the result.

        Reads SGLang's cumulative chunks (0.5.2x) and delta `output_ids` (0.5.5) alike: the ids
        come from the cumulative `output_token_logprobs`, which both versions send.
        """
        payload, top_n = self._payload(input_ids, sampling, rid, True, routing_key)
        seen = 0
        done = False
        try:
            reply = await self._post("/generate", payload, routing_key)
            last: dict[str, Any] | None = None
            with _upstream_errors(self.base_url):
                async for doc in sse_docs(reply):
                    last = doc
                    meta = doc.get("meta_info") or {}
                    triples = meta.get("output_token_logprobs") or []
                    if len(triples) > seen:
                        fresh = triples[seen:]
                        top = None
                        if top_n and meta.get("output_top_logprobs") is not None:
                            rows = meta["output_top_logprobs"][seen:]
                            top = [[(float(e[0]), int(e[1])) for e in (row or [])] for row in rows]
                        seen = len(triples)
                        yield StreamUpdate(
                            [int(t[1]) for t in fresh],
                            new_logprobs=[float(t[0]) if t[0] is not None else float("nan") for t in fresh],
                            new_top=top,
                        )
            if last is None or (last.get("meta_info") or {}).get("finish_reason") is None:
                raise UpstreamError("the engine's stream ended before the generation finished")
            result = _parse_result(last, rid, top_n)
            done = True
            _raise_if_aborted(result)
            yield StreamUpdate([], result)
        finally:
            if not done:
                await self._abort_quietly(rid)

    async def abort(self, rid: str) -> None:
        """Ask the engine to abort `rid` (a no-op if it already finished)."""
        with _upstream_errors(self.base_url):
            reply = await self._transport.request(
                "POST", "/abort_request", orjson.dumps({"rid": rid}), {"Content-Type": "application/json"}
            )
            await reply.read()

    async def _abort_quietly(self, rid: str) -> None:
        with contextlib.suppress(Exception):
            await asyncio.shield(self.abort(rid))

    async def model_info(self) -> dict[str, Any]:
        """The engine's `/model_info` (falling back to the 0.5.5 `/get_model_info`), plus `engine`:
        its logprob semantics from `/server_info` (`engine_semantics.sglang_semantics`), read on the
        first call (start-up) and kept as `semantics` for the samples, so a later call (readiness)
        neither repeats it nor lets a blip change what the samples say."""
        for path in ("/model_info", "/get_model_info"):
            status, info = await self._get(path)
            if status == 200:
                if self.semantics is None:
                    _, server = await self._get("/server_info")
                    self.semantics = sglang_semantics(server if isinstance(server, dict) else None)
                return {**info, "engine": self.semantics.to_metadata()}
        raise StartupError(f"engine at {self.base_url} serves neither /model_info nor /get_model_info")

    async def _get(self, path: str) -> tuple[int, Any]:
        """GET `path`: its status and, when 200, its JSON body (None otherwise)."""
        with _upstream_errors(self.base_url):
            reply = await self._transport.request("GET", path, None, {})
            body = await reply.read()
        return reply.status, orjson.loads(body) if reply.status == 200 else None


async def sse_docs(reply: Reply) -> AsyncIterator[dict[str, Any]]:
    """The JSON documents of an engine's event stream, up to `[DONE]`; an in-stream error raises."""
    async for raw in reply.lines():
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        doc = orjson.loads(data)
        if "error" in doc:
            raise UpstreamError(f"engine stream error: {_error_message(data)}")
        yield doc


@contextlib.contextmanager
def _upstream_errors(base_url: str) -> Iterator[None]:
    """Transport failures as the gateway's upstream errors (the edge: nothing of the transport leaks)."""
    try:
        yield
    except ConnectFailed as exc:
        raise UpstreamUnreached(f"engine unreachable at {base_url}: {exc}") from exc
    except ReadTimeout as exc:
        raise UpstreamTimeout(f"the engine at {base_url} timed out") from exc
    except TransportError as exc:
        raise UpstreamError(f"the connection to the engine at {base_url} failed: {exc}") from exc


def _raise_if_aborted(result: GenerationResult) -> None:
    if result.finish_type == "abort":
        message = result.finish_reason.get("message") or "aborted"
        status = result.finish_reason.get("status_code")
        err = UpstreamAborted(f"the engine aborted the generation: {message}")
        if isinstance(status, int) and 400 <= status < 600:
            err.status = status
        raise err


async def first_answer(updates: AsyncIterator[StreamUpdate]) -> AsyncIterator[StreamUpdate]:
    """Wait for a stream's first answer from the engine (its first tokens, or the whole result),
    raising the engine's error now, then give the whole stream. A streamed turn sends its head
    only after this: an engine that is down, full or refuses the prompt is then a status the
    agent's SDK retries (502/503), not a 200 followed by an in-stream error."""
    first = await anext(updates, None)
    return _chained(first, updates)


async def _chained(
    first: StreamUpdate | None, rest: AsyncIterator[StreamUpdate]
) -> AsyncIterator[StreamUpdate]:
    if first is not None:
        yield first
    async for update in rest:
        yield update
