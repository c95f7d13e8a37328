"""What an engine's recorded logprobs are, and whether it honours seeds: every sample's `metadata.engine`.

One shape for every engine kind. The engine clients (`engine_client/`) fill it once, at start-up,
from what the server says of itself (SGLang's and the embedded engine's `/server_info`, vLLM's
`/version` and `/server_info`); the sessions copy it into every sample; the trainers read it back
(`from_metadata`) to compute the same logprobs from their own logits (docs/ENGINES.md, "Logprob
semantics per engine"). This module knows nothing about HTTP or about any one engine's wire format.

What the fields mean:

- `logprobs` (sampled tokens): `scaled` is `log_softmax(adjusted_logits / T)` (SGLang's default:
  after penalties and `logit_bias`, before top-k/top-p/min-p; greedy unscaled); `raw` is
  `log_softmax(logits)` of the model's logits, whatever the temperature (vLLM's `raw_logprobs`, the
  embedded engine's `--return-original-logprob`); `processed` is after every filter, renormalized
  (vLLM's `processed_logprobs`).
- `forced_logprobs` (teacher-forced prompt tokens: SGLang's `logprob_start_len`, vLLM's
  `prompt_logprobs`): `raw` on all three engines.
- `vocabulary`: `padded` normalizes over the model's whole vocabulary (`config.vocab_size`, the ids
  it pads beyond the tokenizer's included); `tokenizer` over the tokenizer's ids only.
- `seed_honoured`: whether a request's seed makes its sampling repeatable. SGLang applies
  `sampling_seed` only under `--enable-deterministic-inference`, which its CPU backends refuse.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

SCALED, RAW, PROCESSED = "scaled", "raw", "processed"
PADDED, TOKENIZER = "padded", "tokenizer"
KINDS = ("sglang", "rlgw-engine", "vllm")


class EngineSemanticsError(ValueError):
    """A sample's `metadata.engine` is missing or says something no trainer here reproduces."""


@dataclass(frozen=True, slots=True)
class EngineSemantics:
    """How one engine's logprobs relate to the model's logits (module docstring: the fields)."""

    kind: str  # "sglang", "rlgw-engine" (the embedded engine) or "vllm"
    version: str
    logprobs: str  # sampled tokens: SCALED, RAW or PROCESSED
    forced_logprobs: str  # teacher-forced prompt tokens: RAW
    vocabulary: str  # PADDED or TOKENIZER
    greedy_below: float  # temperatures below this sample greedily, with unscaled logprobs
    seed_honoured: bool
    details: dict[str, Any] = field(default_factory=dict)  # engine-specific facts (vLLM's logprobs_mode)

    def to_metadata(self) -> dict[str, Any]:
        """The JSON object a sample carries as `metadata.engine` (`details` flattened into it)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "details"}
        return {**out, **self.details}

    @classmethod
    def from_metadata(cls, doc: Any) -> EngineSemantics:
        """Read a sample's `metadata.engine` back (`EngineSemanticsError` if it is not one)."""
        if not isinstance(doc, dict):
            raise EngineSemanticsError(
                "the sample has no metadata.engine, so how its logprobs were normalized is unknown "
                "(was it recorded by a gateway older than the engine semantics?)"
            )
        names = [f.name for f in fields(cls) if f.name != "details"]
        missing = [n for n in names if n not in doc]
        if missing:
            raise EngineSemanticsError(f"the sample's metadata.engine lacks {', '.join(missing)}: {doc}")
        return cls(**{n: doc[n] for n in names}, details={k: v for k, v in doc.items() if k not in names})

    def not_repeatable_reason(self) -> str | None:
        """Why seeded sampling on this engine is not repeatable, or None when it is."""
        if self.seed_honoured:
            return None
        if self.kind == "sglang":
            return (
                f"SGLang {self.version} applies sampling_seed only when started with "
                "--enable-deterministic-inference (its CPU backends refuse it): seeded runs are not "
                "repeatable"
            )
        return f"{self.kind} {self.version} does not honour sampling seeds: seeded runs are not repeatable"


def sglang_semantics(server_info: dict[str, Any] | None) -> EngineSemantics:
    """The semantics of an SGLang-protocol server (SGLang, sglang-router, the embedded engine) from
    its `/server_info` (None: the server did not answer it; seeds are then taken as not honoured).

    SGLang's sampled logprobs are `scaled` unless `SGLANG_RETURN_ORIGINAL_LOGPROB` is set in its
    environment, which `/server_info` does not show; the embedded engine reports its equivalent
    (`return_original_logprob`).
    """
    info = server_info or {}
    version = str(info.get("version", "unknown"))
    if version.startswith("rlgw-engine"):
        return embedded_semantics(
            version.removeprefix("rlgw-engine").strip(), info.get("return_original_logprob")
        )
    return EngineSemantics(
        kind="sglang",
        version=version,
        logprobs=SCALED,
        forced_logprobs=RAW,
        vocabulary=PADDED,
        greedy_below=1e-6,
        seed_honoured=bool(info.get("enable_deterministic_inference", False)),
        details={} if server_info is not None else {"server_info_reported": False},
    )


def embedded_semantics(version: str, original_logprob: bool = False) -> EngineSemantics:
    """The embedded engine's (`rlgw engine`): SGLang's, and every seed honoured (engine/sampling.py)."""
    return EngineSemantics(
        kind="rlgw-engine",
        version=version,
        logprobs=RAW if original_logprob else SCALED,
        forced_logprobs=RAW,
        vocabulary=PADDED,
        greedy_below=1e-6,
        seed_honoured=True,
    )
