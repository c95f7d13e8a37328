"""The engine client for vLLM: token-in/token-out over vLLM's own `/inference/v1/generate`.

`VLLMBackend` is a `ModelBackend` beside `SGLangBackend`, and shares its HTTP policy (transport,
router affinity header, retry-before-output, abort on cancellation, error mapping); what differs is
the wire format, translated at this edge so nothing above it knows which engine answers:

- the gateway's SGLang sampling params become vLLM `SamplingParams` fields (`max_new_tokens` ->
  `max_tokens`, `sampling_seed` -> `seed`, `json_schema`/`regex`/`ebnf`/`structural_tag` ->
  `structured_outputs`, `top_logprobs_num` -> `logprobs`); a key with no vLLM meaning is refused
  (400), because vLLM ignores unknown sampling keys silently;
- vLLM's reply (`choices[0].token_ids`, `logprobs.content[i].logprob`, `finish_reason` +
  `stop_reason`, `weight_versions` spans) becomes the same `GenerationResult`, read verbatim;
- `model_info` asks `/v1/models`, `/version` and, where the server runs with
  `VLLM_SERVER_DEV_MODE=1`, `/server_info` (tokenizer, `logprobs_mode`) and `/weight_info`, and
  answers in `/model_info`'s shape plus `engine`, the semantics a trainer needs to reproduce the
  recorded logprobs (`engine_semantics`).

The server must run with `--enable-scale-out` (the generate endpoint answers 403 otherwise);
start-up says so. It knows nothing about chat, sessions or ledgers.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
import orjson

from rlgw.gateway.engine_client.backend import (
    GenerationResult,
    SGLangBackend,
    StreamUpdate,
    _raise_if_aborted,
    _upstream_errors,
    sse_docs,
)
from rlgw.gateway.engine_semantics import PADDED, PROCESSED, RAW, EngineSemantics
from rlgw.gateway.errors import InvalidRequest, StartupError, UpstreamError

GENERATE = "/inference/v1/generate"
ABORT = "/inference/v1/abort_requests"
# vLLM's generate endpoint names the engine request `generate-tokens-<request_id>`
# (entrypoints/scale_out/token_in_token_out/serving.py); an abort names that id.
REQUEST_PREFIX = "generate-tokens-"
JSON_HEADERS = {"Content-Type": "application/json"}

# SGLang sampling keys the gateway may send, and the vLLM `SamplingParams` field of each.
RENAMED = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "sampling_seed": "seed"}
SAME = frozenset(
    (
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "logit_bias",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "n",
    )
)
# SGLang's constrained decoding keys, and vLLM's `structured_outputs` field of each.
STRUCTURED = {"json_schema": "json", "regex": "regex", "ebnf": "grammar", "structural_tag": "structural_tag"}
# Keys that only change SGLang's text output or streaming cadence: the gateway reads token ids.
TEXT_ONLY = frozenset(("no_stop_trim", "stream_interval"))

# Greedy below this temperature (vLLM's `_SAMPLING_EPS`; SGLang's is 1e-6).
VLLM_GREEDY_BELOW = 1e-5


def vllm_sampling(sampling: dict[str, Any]) -> dict[str, Any]:
    """vLLM `SamplingParams` for the gateway's SGLang sampling params (raises `InvalidRequest`)."""
    out: dict[str, Any] = {"logprobs": 0}  # 0: the sampled token's logprob only
    structured: dict[str, Any] = {}
    for key, value in sampling.items():
        if key in SAME:
            out[key] = value
        elif key in RENAMED:
            out[RENAMED[key]] = value
        elif key in STRUCTURED:
            structured[STRUCTURED[key]] = orjson.loads(value) if key == "json_schema" else value
        elif key == "top_logprobs_num":
            out["logprobs"] = int(value or 0)
        elif key not in TEXT_ONLY:
            raise InvalidRequest(f"sampling parameter {key!r} has no vLLM equivalent", param=key)
    if structured:
        out["structured_outputs"] = structured
    return out


def _finish(choice: dict[str, Any], max_tokens: int | None) -> dict[str, Any]:
    """SGLang's finish_reason object for a vLLM choice (`stop_reason`: the stop string or id matched,
    None on EOS, where the matched id is the last output id as SGLang reports it)."""
    reason = choice.get("finish_reason") or "stop"
    if reason == "stop":
        matched = choice.get("stop_reason")
        ids = choice.get("token_ids") or []
        return {"type": "stop", "matched": matched if matched is not None else (ids[-1] if ids else None)}
    if reason == "length":
        return {"type": "length", "length": max_tokens}
    return {"type": "abort", "message": f"vLLM finished the request with {reason!r}"}


def _entries(choice: dict[str, Any], top_n: int) -> tuple[list[float], list[list[tuple[float, int]]] | None]:
    content = (choice.get("logprobs") or {}).get("content")
    if content is None:
        raise UpstreamError("vLLM reply has no logprobs: was sampling_params.logprobs ignored?")
    logprobs = [float(e["logprob"]) for e in content]
    top = None
    if top_n:
        top = [[(float(t["logprob"]), int(t["token_id"])) for t in e.get("top_logprobs") or []]
               for e in content]  # fmt: skip
    return logprobs, top


def _spans(choice: dict[str, Any]) -> list[tuple[str, int, int]]:
    return [(str(s["version"]), int(s["start"]), int(s["end"])) for s in choice.get("weight_versions") or []]


def _result(
    rid: str, ids: list[int], logprobs: list[float], top: Any, choice: dict[str, Any], usage: dict, sp: dict
) -> GenerationResult:
    if len(logprobs) != len(ids):
        raise UpstreamError(f"vLLM returned {len(ids)} token ids but {len(logprobs)} logprobs")
    spans = _spans(choice)
    return GenerationResult(
        rid=rid,
        output_ids=ids,
        logprobs=logprobs,
        finish_reason=_finish({**choice, "token_ids": ids}, sp.get("max_tokens")),
        # The version that sampled the last token (the spans say which sampled each).
        weight_version=spans[-1][0] if spans else "default",
        prompt_tokens=int((usage or {}).get("prompt_tokens", 0)),
        cached_tokens=int(((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)),
        top_logprobs=top,
        version_spans=spans if len({s[0] for s in spans}) > 1 else [],
    )


class VLLMBackend(SGLangBackend):
    """`ModelBackend` over vLLM's `/inference/v1/generate` (token ids in, token ids and logprobs out).

    Inherits `SGLangBackend`'s transport and request policy (retries only before the request can
    have reached the engine, abort when cancelled, typed upstream errors); only the wire format
    and the engine's description differ.
    """

    def _vllm_payload(
        self, input_ids: Sequence[int] | np.ndarray, sampling: dict[str, Any], rid: str, stream: bool
    ) -> tuple[bytes, dict[str, Any], int]:
        sp = vllm_sampling(sampling)
        body: dict[str, Any] = {
            "request_id": rid,
            "sampling_params": sp,
            "stream": stream,
            "output_mode": "tokens",
        }
        if stream:  # a last chunk with the usage (cached prompt tokens, where the server counts them)
            body["stream_options"] = {"include_usage": True}
        ids = orjson.dumps(np.asarray(input_ids, dtype=np.int64), option=orjson.OPT_SERIALIZE_NUMPY)
        return b"".join((b'{"token_ids":', ids, b",", orjson.dumps(body)[1:])), sp, sp["logprobs"]

    async def generate(
        self, input_ids: Sequence[int] | np.ndarray, sampling: dict[str, Any], *, rid: str, routing_key: str
    ) -> GenerationResult:
        """Generate from `input_ids` and return the sampled ids and their logprobs."""
        payload, sp, top_n = self._vllm_payload(input_ids, sampling, rid, False)
        try:
            reply = await self._post(GENERATE, payload, routing_key)
            with _upstream_errors(self.base_url):
                doc = orjson.loads(await reply.read())
        except BaseException:
            await self._abort_quietly(rid)
            raise
        choices = doc.get("choices") or []
        if len(choices) != 1:
            raise UpstreamError(f"vLLM answered {len(choices)} choices for one request")
        choice = choices[0]
        ids = [int(t) for t in choice.get("token_ids") or []]
        logprobs, top = _entries(choice, top_n)
        result = _result(rid, ids, logprobs, top, choice, doc.get("usage") or {}, sp)
        _raise_if_aborted(result)
        return result

    async def stream(
        self, input_ids: Sequence[int] | np.ndarray, sampling: dict[str, Any], *, rid: str, routing_key: str
    ) -> AsyncIterator[StreamUpdate]:
        """Stream a generation: vLLM's chunks carry the new ids and logprobs (deltas); the last
        one carries the finish reason and the weight-version spans."""
        payload, sp, top_n = self._vllm_payload(input_ids, sampling, rid, True)
        ids: list[int] = []
        logprobs: list[float] = []
        top: list[list[tuple[float, int]]] | None = [] if top_n else None
        final: dict[str, Any] | None = None
        usage: dict[str, Any] = {}
        done = False
        try:
            reply = await self._post(GENERATE, payload, routing_key)
            with _upstream_errors(self.base_url):
                async for doc in sse_docs(reply):
                    usage = doc.get("usage") or usage
                    for choice in doc.get("choices") or []:
                        new = [int(t) for t in choice.get("token_ids") or []]
                        new_lp, new_top = _entries(choice, top_n) if new else ([], [] if top_n else None)
                        if len(new_lp) != len(new):
                            raise UpstreamError(f"vLLM streamed {len(new)} ids but {len(new_lp)} logprobs")
                        ids += new
                        logprobs += new_lp
                        if top is not None and new_top is not None:
                            top += new_top
                        if choice.get("finish_reason") is not None:
                            final = choice
                        if new:
                            yield StreamUpdate(new, new_logprobs=new_lp, new_top=new_top)
            if final is None:
                raise UpstreamError("the engine's stream ended before the generation finished")
            result = _result(rid, ids, logprobs, top, final, usage, sp)
            done = True
            _raise_if_aborted(result)
            yield StreamUpdate([], result)
        finally:
            if not done:
                await self._abort_quietly(rid)

    async def abort(self, rid: str) -> None:
        """Ask vLLM to abort `rid` (a no-op if it already finished)."""
        body = orjson.dumps({"request_ids": [REQUEST_PREFIX + rid]})
        with _upstream_errors(self.base_url):
            reply = await self._transport.request("POST", ABORT, body, JSON_HEADERS)
            await reply.read()

    async def model_info(self) -> dict[str, Any]:
        """What vLLM serves, in `/model_info`'s shape, plus `engine` (`engine_semantics`).

        Raises `StartupError` when the server is not vLLM or its generate endpoint is off.
        """
        status, models = await self._get("/v1/models")
        _, version = await self._get("/version")
        if status != 200 or not (models or {}).get("data") or not isinstance(version, dict):
            raise StartupError(f"{self.base_url} does not answer like a vLLM server (/v1/models, /version)")
        card = models["data"][0]
        with _upstream_errors(self.base_url):  # 400 (the empty body) means the endpoint is on
            probe = await self._transport.request("POST", GENERATE, b"{}", JSON_HEADERS)
            await probe.read()
        if probe.status in (403, 404):
            raise StartupError(
                f"vLLM at {self.base_url} does not serve {GENERATE} (HTTP {probe.status}): "
                "start it with --enable-scale-out"
            )
        config: dict[str, Any] = {}
        _, info = await self._get("/server_info?config_format=json")  # VLLM_SERVER_DEV_MODE=1 only
        if isinstance(info, dict) and isinstance(info.get("vllm_config"), dict):
            config = info["vllm_config"].get("model_config") or {}
        _, weights = await self._get("/weight_info")  # VLLM_SERVER_DEV_MODE=1 only
        self.semantics = engine_semantics(str(version.get("version")), config.get("logprobs_mode"))
        return {
            "model_path": card.get("root") or card["id"],
            "tokenizer_path": config.get("tokenizer") or card.get("root") or card["id"],
            "served_model_name": card["id"],
            "context_length": card.get("max_model_len"),
            "weight_version": (weights or {}).get("weight_version", "default"),
            "engine": self.semantics.to_metadata(),
        }


def engine_semantics(version: str, logprobs_mode: str | None) -> EngineSemantics:
    """How this vLLM's recorded logprobs relate to the model's logits (docs/ENGINES.md).

    `logprobs_mode` None: the server did not say (no dev mode); vLLM's default is `raw_logprobs`.
    vLLM normalizes over `config.vocab_size` (its `LogitsProcessor` cuts only the lm-head's
    tensor-parallel padding), and its `prompt_logprobs` are raw in every mode.
    """
    mode = logprobs_mode or "raw_logprobs"
    if mode not in ("raw_logprobs", "processed_logprobs"):
        raise StartupError(f"vLLM's logprobs_mode {mode!r} returns logits, not logprobs: serve raw_logprobs")
    return EngineSemantics(
        kind="vllm",
        version=version,
        # raw: log_softmax of the model's logits, before penalties, bias, temperature, top-k/p, min-p.
        # processed: after all of them, renormalized over the tokens top-k/p and min-p keep.
        logprobs=RAW if mode == "raw_logprobs" else PROCESSED,
        forced_logprobs=RAW,
        vocabulary=PADDED,
        greedy_below=VLLM_GREEDY_BELOW,
        seed_honoured=True,  # `seed`: a per-request generator, whatever the batch
        details={"logprobs_mode": mode, "logprobs_mode_reported": logprobs_mode is not None},
    )


ENGINE_KINDS = ("sglang", "vllm")


def make_backend(kind: str, base_url: str) -> SGLangBackend:
    """The engine client for `kind` (`sglang`: SGLang, sglang-router or the embedded engine)."""
    if kind == "vllm":
        return VLLMBackend(base_url)
    if kind == "sglang":
        return SGLangBackend(base_url)
    raise StartupError(f"unknown engine kind {kind!r}; expected one of {', '.join(ENGINE_KINDS)}")


def detect_engine_kind(base_url: str, wait: float = 600.0) -> str:
    """`vllm` or `sglang`, from what the server at `base_url` answers (waits up to `wait` seconds
    for it to answer at all): SGLang and the embedded engine serve `/model_info`, vLLM `/version`."""
    import httpx

    deadline = time.monotonic() + wait
    while True:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            if httpx.get(base_url.rstrip("/") + "/model_info", timeout=5).status_code == 200:
                return "sglang"
            r = httpx.get(base_url.rstrip("/") + "/version", timeout=5)
            if r.status_code == 200 and "version" in r.json():
                return "vllm"
        if time.monotonic() > deadline:
            raise StartupError(f"no SGLang or vLLM server answered at {base_url} within {wait:.0f}s")
        time.sleep(0.5)
