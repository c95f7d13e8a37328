"""Sampling parameters (SGLang's names, defaults and checks) and the batched sampler.

Owns: parsing/validating a request's `sampling_params` dict into `SamplingParams`, and turning one
step's logits into sampled ids plus log-probabilities. Knows nothing about requests, caches or HTTP.

Log-probability semantics (matching SGLang's default, `SGLANG_RETURN_ORIGINAL_LOGPROB` unset):
sampled tokens' logprobs are taken AFTER temperature scaling and logit adjustments (penalties,
`logit_bias`) and BEFORE top-k / top-p / min-p filtering: `log_softmax(adjusted_logits / temperature)`
over every column of `logits` (the model's whole vocabulary). Greedy requests (temperature < 1e-6)
get the unscaled `log_softmax(adjusted_logits)`. With `original_logprob=True` (the engine's
`--return-original-logprob`, like SGLang's env var) logprobs are the unscaled `log_softmax(logits)`
of the raw model logits whatever the temperature. Teacher-forced prompt logprobs are always the raw
`log_softmax(logits)` (the runner's `_prompt_logprobs`), as SGLang's `input_token_logprobs` are.

Determinism: every request owns a `torch.Generator`; a request with `sampling_seed` seeds it, so the
same seed gives the same tokens whatever other requests share the batch (each row draws only from
its own generator, in its own order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from rlgw.engine.errors import SamplingParamsError, UnknownFieldError

GREEDY_EPS = 1e-6

# Every key SGLang's `SamplingParams` accepts (0.5.2x), in its order: the unknown-key message lists them.
KNOWN_KEYS: tuple[str, ...] = (
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "custom_params",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
)
# Accepted for compatibility but not implemented here: a non-null value is refused loudly.
UNSUPPORTED_KEYS = ("stop_regex", "custom_params")
# Constraints (a JSON string, a regex, an EBNF grammar, an xgrammar structural tag), run by
# `rlgw.engine.grammar`; SGLang refuses more than one of the first three.
CONSTRAINT_KEYS = ("json_schema", "regex", "ebnf", "structural_tag")


@dataclass(slots=True)
class SamplingParams:
    """One request's sampling parameters, with SGLang's defaults."""

    max_new_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    n: int = 1
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    stream_interval: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    sampling_seed: int | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None

    @property
    def greedy(self) -> bool:
        """True when temperature is below 1e-6 (SGLang's greedy rule)."""
        return self.temperature < GREEDY_EPS

    @property
    def needs_filter(self) -> bool:
        """True when top-k, top-p or min-p cut the distribution."""
        return self.top_k != -1 or self.top_p < 1.0 or self.min_p > 0.0

    @property
    def needs_penalty(self) -> bool:
        """True when any frequency/presence/repetition penalty is active."""
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repetition_penalty != 1.0


def _unknown_field_message(key: str) -> str:
    # serde's wording, which SGLang's contract check emits verbatim.
    listed = ", ".join(f"`{k}`" for k in KNOWN_KEYS)
    return f"unknown field `{key}`, expected one of {listed}"


def _num(raw: dict, key: str, kind: type, default):
    value = raw.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SamplingParamsError(f"sampling_params.{key} must be a number, got {value!r}")
    if kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise SamplingParamsError(f"sampling_params.{key} must be an integer, got {value!r}")
        return int(value)
    if not math.isfinite(value):
        raise SamplingParamsError(f"sampling_params.{key} must be finite, got {value!r}")
    return float(value)


def _flag(raw: dict, key: str, default: bool) -> bool:
    value = raw.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise SamplingParamsError(f"sampling_params.{key} must be a boolean, got {value!r}")
    return value


def parse_sampling_params(raw: dict | None) -> SamplingParams:
    """Validate a request's `sampling_params` dict and return the typed parameters.

    Raises `UnknownFieldError` for a key SGLang does not know, `SamplingParamsError` for a value
    outside SGLang's ranges or a feature this engine does not implement.
    """
    raw = raw or {}
    if not isinstance(raw, dict):
        raise SamplingParamsError(f"sampling_params must be an object, got {type(raw).__name__}")
    for key in raw:
        if key not in KNOWN_KEYS:
            raise UnknownFieldError(_unknown_field_message(key))
    for key in UNSUPPORTED_KEYS:
        if raw.get(key) is not None:
            raise SamplingParamsError(f"sampling_params.{key} is not supported by the embedded rlgw engine")

    stop = raw.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise SamplingParamsError("sampling_params.stop must be a non-empty string or a list of them")
    stop_ids = raw.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in stop_ids
    ):
        raise SamplingParamsError("sampling_params.stop_token_ids must be a list of integers")
    bias_raw = raw.get("logit_bias") or {}
    if not isinstance(bias_raw, dict):
        raise SamplingParamsError("sampling_params.logit_bias must be an object of token id -> bias")
    try:
        bias = {int(k): float(v) for k, v in bias_raw.items()}
    except (TypeError, ValueError) as exc:
        raise SamplingParamsError(f"sampling_params.logit_bias is malformed: {exc}") from exc
    seed = raw.get("sampling_seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise SamplingParamsError(f"sampling_params.sampling_seed must be an integer, got {seed!r}")
    for key in CONSTRAINT_KEYS:
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise SamplingParamsError(
                f"sampling_params.{key} must be a string, got {type(raw[key]).__name__}"
            )

    p = SamplingParams(
        max_new_tokens=_num(raw, "max_new_tokens", int, 128),
        stop=list(stop),
        stop_token_ids=list(stop_ids),
        temperature=_num(raw, "temperature", float, 1.0),
        top_p=_num(raw, "top_p", float, 1.0),
        top_k=_num(raw, "top_k", int, -1),
        min_p=_num(raw, "min_p", float, 0.0),
        frequency_penalty=_num(raw, "frequency_penalty", float, 0.0),
        presence_penalty=_num(raw, "presence_penalty", float, 0.0),
        repetition_penalty=_num(raw, "repetition_penalty", float, 1.0),
        min_new_tokens=_num(raw, "min_new_tokens", int, 0),
        n=_num(raw, "n", int, 1),
        ignore_eos=_flag(raw, "ignore_eos", False),
        skip_special_tokens=_flag(raw, "skip_special_tokens", True),
        spaces_between_special_tokens=_flag(raw, "spaces_between_special_tokens", True),
        no_stop_trim=_flag(raw, "no_stop_trim", False),
        stream_interval=_num(raw, "stream_interval", int, None),
        logit_bias=bias,
        sampling_seed=seed,
        json_schema=raw.get("json_schema"),
        regex=raw.get("regex"),
        ebnf=raw.get("ebnf"),
        structural_tag=raw.get("structural_tag"),
    )
    _verify(p)
    return p


def _verify(p: SamplingParams) -> None:
    """SGLang's `SamplingParams.verify` ranges."""
    problems = []
    if p.temperature < 0.0:
        problems.append(f"temperature must be non-negative, got {p.temperature}.")
    if not 0.0 < p.top_p <= 1.0:
        problems.append(f"top_p must be in (0, 1], got {p.top_p}.")
    if not 0.0 <= p.min_p <= 1.0:
        problems.append(f"min_p must be in [0, 1], got {p.min_p}.")
    if p.top_k < 1 and p.top_k != -1:
        problems.append(f"top_k must be -1 (disable) or at least 1, got {p.top_k}.")
    if not -2.0 <= p.frequency_penalty <= 2.0:
        problems.append(f"frequency_penalty must be in [-2, 2], got {p.frequency_penalty}.")
    if not -2.0 <= p.presence_penalty <= 2.0:
        problems.append(f"presence_penalty must be in [-2, 2], got {p.presence_penalty}.")
    if not 0.0 < p.repetition_penalty <= 2.0:
        problems.append(f"repetition_penalty must be in (0, 2], got {p.repetition_penalty}.")
    if p.max_new_tokens < 0:
        problems.append(f"max_new_tokens must be at least 0, got {p.max_new_tokens}.")
    if p.min_new_tokens < 0 or p.min_new_tokens > max(p.max_new_tokens, 0):
        problems.append(f"min_new_tokens must be in [0, max_new_tokens], got {p.min_new_tokens}.")
    if p.n < 1:
        problems.append(f"n must be at least 1, got {p.n}.")
    if p.stream_interval is not None and p.stream_interval < 1:
        problems.append(f"stream_interval must be at least 1, got {p.stream_interval}.")
    if sum(g is not None for g in (p.json_schema, p.regex, p.ebnf)) > 1:
        problems.append("Only one of regex, json_schema, or ebnf can be set.")
    if problems:
        raise SamplingParamsError(" ".join(problems))


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator seeded by `seed`, or from fresh OS entropy when `seed` is None."""
    g = torch.Generator()
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed & 0xFFFF_FFFF_FFFF_FFFF)
    return g


@dataclass(slots=True)
class SamplerRow:
    """What the sampler needs of one running request for one step."""

    params: SamplingParams
    generator: torch.Generator
    output_ids: list[int]
    suppress_ids: list[int] | None = None  # stop/EOS ids banned until min_new_tokens is reached


def _adjust(logits: torch.Tensor, rows: list[SamplerRow]) -> torch.Tensor:
    """Penalties, logit bias and min_new_tokens suppression, applied per row where needed."""
    out = logits
    for i, row in enumerate(rows):
        p = row.params
        if not (p.needs_penalty or p.logit_bias or row.suppress_ids):
            continue
        if out is logits:
            out = logits.clone()
        line = out[i]
        if p.needs_penalty and row.output_ids:
            ids = torch.tensor(row.output_ids, dtype=torch.long)
            uniq, counts = torch.unique(ids, return_counts=True)
            if p.repetition_penalty != 1.0:
                vals = line[uniq]
                line[uniq] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
            if p.frequency_penalty != 0.0:
                line[uniq] -= p.frequency_penalty * counts.to(line.dtype)
            if p.presence_penalty != 0.0:
                line[uniq] -= p.presence_penalty
        if p.logit_bias:
            ids = torch.tensor(list(p.logit_bias), dtype=torch.long)
            line[ids] += torch.tensor(list(p.logit_bias.values()), dtype=line.dtype)
        if row.suppress_ids:
            line[torch.tensor(row.suppress_ids, dtype=torch.long)] = float("-inf")
    return out


def _filtered_probs(probs: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Top-k, then top-p, then min-p on one row of probabilities (SGLang's torch fallback order)."""
    sorted_p, idx = probs.sort(descending=True)
    if p.top_k != -1:
        sorted_p[p.top_k :] = 0.0
    if p.top_p < 1.0:
        cum = sorted_p.cumsum(0)
        sorted_p[(cum - sorted_p) > p.top_p] = 0.0
    if p.min_p > 0.0:
        sorted_p[sorted_p < sorted_p[0] * p.min_p] = 0.0
    return torch.zeros_like(probs).scatter_(0, idx, sorted_p)


def sample(
    logits: torch.Tensor,
    rows: list[SamplerRow],
    original_logprob: bool = False,
    need_logprobs: bool = True,
    sample_vocab: int | None = None,
) -> tuple[list[int], torch.Tensor | None]:
    """Sample one token per row of `logits` [B, V] (fp32).

    Returns the sampled ids and the [B, V] log-probabilities that the returned/recorded logprobs are
    read from (see the module docstring for which distribution that is); None when no row samples
    and `need_logprobs` is False (an all-greedy batch that records nothing skips the softmax).
    `sample_vocab`: ids at and past it are never drawn, but keep their mass in the logprobs (the
    model's padded ids: `rlgw.engine.runner.ModelRunner` says why).
    """
    adjusted = _adjust(logits, rows)
    drawable = adjusted[:, :sample_vocab]
    if not need_logprobs and all(r.params.greedy for r in rows):
        return drawable.argmax(dim=-1).tolist(), None
    temps = torch.tensor(
        [1.0 if r.params.greedy else r.params.temperature for r in rows], dtype=adjusted.dtype
    ).unsqueeze(1)
    scaled = adjusted if bool((temps == 1.0).all()) else adjusted / temps
    logprobs = torch.log_softmax(scaled, dim=-1)
    ids: list[int] = []
    for i, row in enumerate(rows):
        p = row.params
        if p.greedy:
            ids.append(int(drawable[i].argmax()))
            continue
        probs = logprobs[i, :sample_vocab].exp()
        if p.needs_filter:
            probs = _filtered_probs(probs, p)
        try:
            ids.append(int(torch.multinomial(probs, 1, generator=row.generator)))
        except RuntimeError:
            # Every token masked (a grammar at odds with min_new_tokens): the argmax of -inf is id 0,
            # which the caller's grammar refuses, failing this request alone instead of the batch.
            ids.append(int(drawable[i].argmax()))
    if original_logprob:
        logprobs = torch.log_softmax(logits, dim=-1)
    return ids, logprobs
