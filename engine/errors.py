"""The embedded engine's errors, one tree; each says where it is answered and with what.

    EngineError                      base of every error the embedded engine raises
     ├── ModelError                  a checkpoint the engine cannot serve (start-up)
     │    └── ModelResolutionError   a `--model` spec that names nothing loadable
     ├── RequestError                a request refused with HTTP 400; `body` is the JSON to send
     │    ├── SamplingParamsError    a `sampling_params` value outside SGLang's ranges
     │    │    └── UnknownFieldError an unknown `sampling_params` key (a plain-string `error`)
     │    └── GrammarError           a json_schema / regex / ebnf / structural_tag that does not compile
     ├── QueueFullError              the waiting queue cannot take the request(s) (HTTP 503)
     └── WeightUpdateError           a weight update that does not fit the live model; nothing changed

`RequestError.body` is SGLang's error shape: `{"error": {"message": ...}}`, except for an unknown
`sampling_params` key, which SGLang's contract check answers with `{"error": "<serde message>"}`.
The weight-sync routes answer a `RequestError` with SGLang's `{"success": false, "message"}` instead.
This module owns the classes only; the server and the routes decide the HTTP replies.
"""

from __future__ import annotations

from typing import Any


class EngineError(Exception):
    """Base of the embedded engine's errors."""


class ModelError(EngineError):
    """A checkpoint the engine cannot serve (not a causal LM, unsupported logit transforms)."""


class ModelResolutionError(ModelError):
    """A `--model` spec names nothing loadable (missing directory, missing package, failed conversion)."""


class RequestError(EngineError):
    """A request SGLang would refuse with 400 (bad body, too long, bad token ids, bad logprob_start_len)."""

    @property
    def body(self) -> dict[str, Any]:
        """The exact JSON error body to answer with."""
        return {"error": {"message": str(self)}}


class SamplingParamsError(RequestError):
    """A `sampling_params` dict that SGLang would refuse (400)."""


class UnknownFieldError(SamplingParamsError):
    """An unknown key in `sampling_params` (SGLang answers with a plain-string `error`)."""

    @property
    def body(self) -> dict[str, Any]:
        """SGLang's contract-check body: `error` is the message itself."""
        return {"error": str(self)}


class GrammarError(RequestError):
    """A constraint (json_schema, regex, ebnf, structural_tag) that does not compile."""


class QueueFullError(EngineError):
    """The bounded waiting queue is full."""


class WeightUpdateError(EngineError):
    """Named tensors that do not match the live model (unknown name, shape or dtype)."""
