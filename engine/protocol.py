"""SGLang's `/generate` wire shapes: parse a request body into per-sample specs, render outputs.

Owns the JSON contract of `/generate` (see `docs/SGLANG_PROTOCOL.md` section 1): single,
batch and n > 1 inputs, per-item fields, rid rules, the error bodies, and the response/chunk shapes
(`text`, `output_ids`, `meta_info` with finish_reason, token counts, logprob triples). It does not
run anything: the engine core generates, the server moves bytes.

With n > 1 every sample gets its own fresh rid and its own generator; a `sampling_seed` seeds each of
them alike, so n seeded samples are n copies (omit the seed for independent samples).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlgw.engine.errors import RequestError
from rlgw.engine.request import Request, Update, new_rid
from rlgw.engine.routing import encode_rows, routed_rows
from rlgw.engine.sampling import SamplingParams, parse_sampling_params


@dataclass(slots=True)
class Item:
    """One sample to generate; `index` is its place in the reply list (a prompt's n samples adjacent)."""

    index: int
    rid: str
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool
    logprob_start_len: int
    top_logprobs_num: int
    return_text_in_logprobs: bool
    return_routed_experts: bool = False
    routed_experts_start_len: int = 0


@dataclass(slots=True)
class GenerateCall:
    """A parsed `/generate` body."""

    items: list[Item]
    listed: bool  # reply with a JSON list (batch input or n > 1); chunks carry "index"
    stream: bool


def _per_item(value: Any, i: int, count: int, name: str, batch: bool) -> Any:
    if batch and isinstance(value, list):
        if len(value) != count:
            raise RequestError(f"{name} has {len(value)} entries for a batch of {count} inputs")
        return value[i]
    return value


def _int(value: Any, name: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{name} must be an integer, got {value!r}")
    return value


def parse_generate(body: Any, encode) -> GenerateCall:
    """Normalize a `/generate` body; `encode(text) -> ids` tokenizes text inputs.

    Raises `RequestError` (its `body` is SGLang's: a plain-string `error` for an unknown
    `sampling_params` key, `{"error": {"message"}}` for anything else).
    """
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise RequestError("Either text or input_ids should be provided (exactly one of them).")
    if text is not None:
        batch = isinstance(text, list)
        texts = text if batch else [text]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise RequestError("text must be a string or a non-empty list of strings")
        prompts = [encode(t) for t in texts]
    else:
        batch = isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list)
        prompts = input_ids if batch else [input_ids]
        for ids in prompts:
            if not isinstance(ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in ids
            ):
                raise RequestError("input_ids must be a list of integers or a list of such lists")
    count = len(prompts)

    raw_params = body.get("sampling_params")
    if batch and isinstance(raw_params, list):
        if len(raw_params) != count:
            raise RequestError(f"sampling_params has {len(raw_params)} entries for a batch of {count} inputs")
        params_list = raw_params
    else:
        params_list = [raw_params] * count
    parsed = [parse_sampling_params(p) for p in params_list]

    rid = body.get("rid")
    if rid is not None and not isinstance(rid, (str, list)):
        raise RequestError("rid must be a string or a list of strings")
    if isinstance(rid, list) and len(rid) != count:
        raise RequestError(f"rid has {len(rid)} entries for a batch of {count} inputs")
    stream = bool(body.get("stream", False))
    listed = batch or any(p.n > 1 for p in parsed)

    items: list[Item] = []
    for i, (ids, params) in enumerate(zip(prompts, parsed, strict=True)):
        return_logprob = bool(
            _per_item(body.get("return_logprob"), i, count, "return_logprob", batch) or False
        )
        start = _int(
            _per_item(body.get("logprob_start_len"), i, count, "logprob_start_len", batch),
            "logprob_start_len",
            -1,
        )
        top_n = _int(
            _per_item(body.get("top_logprobs_num"), i, count, "top_logprobs_num", batch),
            "top_logprobs_num",
            0,
        )
        if top_n < 0:
            raise RequestError(f"top_logprobs_num must be non-negative, got {top_n}")
        with_text = bool(
            _per_item(body.get("return_text_in_logprobs"), i, count, "return_text_in_logprobs", batch)
        )
        routed, routed_start = _routing_fields(body, i, count, batch, len(ids))
        for _ in range(params.n):
            if params.n > 1:
                item_rid = new_rid()  # SGLang mints a fresh rid per sample when n > 1
            elif isinstance(rid, list):
                item_rid = str(rid[i])
            elif isinstance(rid, str):
                item_rid = f"{rid}_{i}" if batch else rid
            else:
                item_rid = new_rid()
            items.append(
                Item(
                    len(items),
                    item_rid,
                    list(ids),
                    params,
                    return_logprob,
                    start,
                    top_n,
                    with_text,
                    routed,
                    routed_start,
                )
            )
    return GenerateCall(items=items, listed=listed, stream=stream)


def _routing_fields(body: dict, i: int, count: int, batch: bool, prompt_len: int) -> tuple[bool, int]:
    """`return_routed_experts` and `routed_experts_start_len` of item `i` (SGLang's bounds on the start)."""
    routed = bool(_per_item(body.get("return_routed_experts"), i, count, "return_routed_experts", batch))
    start = _int(
        _per_item(body.get("routed_experts_start_len"), i, count, "routed_experts_start_len", batch),
        "routed_experts_start_len",
        0,
    )
    if routed and not 0 <= start <= prompt_len:
        raise RequestError(
            f"routed_experts_start_len={start} must be in [0, {prompt_len}], the number of input tokens"
        )
    return routed, start


def _triples(values: list, ids: list[int], texts: list[str] | None) -> list[list]:
    if texts is None:
        return [[v, t, None] for v, t in zip(values, ids, strict=True)]
    return [[v, t, s] for v, t, s in zip(values, ids, texts, strict=True)]


def _top_rows(rows: list, decode_many) -> list:
    out = []
    for row in rows:
        if row is None:
            out.append(None)
            continue
        ids = [i for _, i in row]
        texts = decode_many(ids) if decode_many else None
        out.append(_triples([v for v, _ in row], ids, texts))
    return out


def render(item: Item, req: Request, update: Update, decode_many, with_index: bool) -> dict[str, Any]:
    """The SGLang output object for one sample as of `update` (cumulative in every chunk).

    `decode_many(ids) -> list[str]` gives per-token text when `return_text_in_logprobs` is set.
    """
    n = update.n_out
    out_ids = req.output_ids[:n]
    reason = update.finish_reason
    meta: dict[str, Any] = {"id": req.rid, "finish_reason": reason}
    waiting_abort = reason is not None and reason.get("message") == "Abort in waiting queue"
    if not waiting_abort:
        meta["prompt_tokens"] = len(req.input_ids)
    meta["completion_tokens"] = n
    if not waiting_abort:
        meta["cached_tokens"] = req.cached_tokens
    meta["reasoning_tokens"] = 0
    meta["weight_version"] = update.weight_version
    meta["num_retractions"] = req.num_retractions
    if item.return_logprob:
        texts = decode_many if item.return_text_in_logprobs else None
        out_lp = req.output_logprobs[:n]
        meta["output_token_logprobs"] = _triples(
            out_lp, out_ids[: len(out_lp)], texts(out_ids) if texts else None
        )
        meta["output_token_logprobs_length"] = len(out_lp)
        in_lp = req.input_logprobs
        in_ids = req.input_ids[item.logprob_start_len :] if item.logprob_start_len >= 0 else []
        meta["input_token_logprobs"] = _triples(
            in_lp, in_ids[: len(in_lp)], texts(in_ids) if texts and in_lp else None
        )
        if item.top_logprobs_num > 0:
            meta["output_top_logprobs"] = _top_rows(req.output_top_logprobs[:n], texts)
            meta["input_top_logprobs"] = _top_rows(req.input_top_logprobs, texts)
    if req.return_routed_experts and reason is not None:
        rows = routed_rows(req)
        meta["routed_experts"] = "" if rows is None else encode_rows(rows)
    if update.e2e_latency is not None:
        meta["e2e_latency"] = round(update.e2e_latency, 6)
    obj: dict[str, Any] = {"text": update.text, "output_ids": out_ids, "meta_info": meta}
    if with_index:
        obj["index"] = item.index
    return obj


def abort_status(reason: dict | None) -> int | None:
    """The HTTP status a non-streamed request must fail with (an abort carrying a 4xx/5xx code)."""
    if reason and reason.get("type") == "abort":
        code = reason.get("status_code")
        if isinstance(code, int) and 400 <= code <= 599:
            return code
    return None
