"""The SGLang protocol the gateway relies on, asserted on the embedded engine and on the real SGLang.

Each test runs once per engine, both serving the same model: tiny-qwen3 with every weight perturbed and
its padded vocabulary rows (ids past the tokenizer's 4026, up to the model's 4096) far from zero, so a
softmax over the padded vocabulary and one over the tokenizer's differ (by about 0.01). Reference
logprobs come from a float32 Hugging Face forward of that model. The assertions are SGLang 0.5.23's
behaviour, and the embedded engine is held to it; where SGLang's behaviour is a setting the embedded
engine does not copy (seeds), the test asserts what each does. docs/SGLANG_PROTOCOL.md's table is this
module, row for row.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.support.procs import engine_server
from tests.support.sglang_env import sglang_python, sglang_server
from tests.support.trainer_logprobs import padded_perturbed_model

ENGINES = ("embedded", "sglang")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return padded_perturbed_model(tmp_path_factory.mktemp("conformance") / "model")


@pytest.fixture(scope="module", params=ENGINES)
def engine(
    request: pytest.FixtureRequest, model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The base URL of one engine serving `model` (embedded, then the real SGLang)."""
    if request.param == "embedded":
        server = engine_server(model)
    else:
        sglang_python()
        server = sglang_server(model, log=tmp_path_factory.mktemp("conformance-sglang") / "sglang.log")
    with server as url:
        yield url


@pytest.fixture(scope="module")
def reference(model: Path) -> Any:
    """The model in float32 Hugging Face: `reference(ids)` -> logits at every position."""
    hf = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32).eval()

    def logits(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return hf(torch.tensor([ids])).logits[0].double()

    return logits


@pytest.fixture(scope="module")
def tokenizer(model: Path) -> Any:
    return AutoTokenizer.from_pretrained(model)


@pytest.fixture(scope="module")
def prompt(tokenizer: Any) -> list[int]:
    return tokenizer.encode("The weather in Paris is sunny and the capital of France")


def _kind(engine: str) -> str:
    info = httpx.get(engine + "/server_info", timeout=30).json()
    return "embedded" if str(info.get("version", "")).startswith("rlgw-engine") else "sglang"


def generate(engine: str, ids: list[int], status: int = 200, **body: Any) -> Any:
    r = httpx.post(engine + "/generate", json={"input_ids": ids, **body}, timeout=120)
    assert r.status_code == status, r.text
    return r.json()


def greedy(engine: str, ids: list[int], n: int = 8, **params: Any) -> dict[str, Any]:
    params = {"max_new_tokens": n, "temperature": 0.0, **params}
    return generate(engine, ids, sampling_params=params, return_logprob=True)


def _scores(meta: dict[str, Any], key: str = "output_token_logprobs") -> np.ndarray:
    return np.asarray([e[0] for e in meta[key]], dtype=float)


def _expected(logits: torch.Tensor, ids: list[int], start: int, temperature: float = 1.0) -> np.ndarray:
    """log_softmax over the whole (padded) vocabulary of the logits before each of `ids[start:]`."""
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return np.asarray([float(lp[i - 1, ids[i]]) for i in range(start, len(ids))])


# -- reply shapes ----------------------------------------------------------------------------------


META_TYPES = {
    "id": str,
    "finish_reason": dict,
    "prompt_tokens": int,
    "completion_tokens": int,
    "cached_tokens": int,
    "weight_version": str,
    "output_token_logprobs": list,
    "input_token_logprobs": list,
    "e2e_latency": float,
}


def test_a_reply_has_sglangs_shape(engine: str, prompt: list[int]) -> None:
    out = greedy(engine, prompt, 6)
    meta = out["meta_info"]
    assert isinstance(out["text"], str) and len(out["output_ids"]) == 6
    assert {k: type(meta[k]) for k in META_TYPES} == META_TYPES
    assert meta["prompt_tokens"] == len(prompt) and meta["completion_tokens"] == 6
    assert meta["input_token_logprobs"] == []  # no logprob_start_len: output tokens only
    for entry, token in zip(meta["output_token_logprobs"], out["output_ids"], strict=True):
        assert isinstance(entry[0], float) and entry[1:] == [token, None]


# -- finish_reason forms -----------------------------------------------------------------------------


def test_finish_reason_length_says_the_limit(engine: str, prompt: list[int]) -> None:
    assert greedy(engine, prompt, 5)["meta_info"]["finish_reason"] == {"type": "length", "length": 5}


def test_finish_reason_stop_on_a_token_says_its_id(engine: str, prompt: list[int]) -> None:
    free = greedy(engine, prompt, 12)["output_ids"]
    k = next(i for i in range(2, len(free)) if free[i] not in free[:i])
    out = greedy(engine, prompt, 12, stop_token_ids=[free[k]])
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": free[k]}
    assert out["output_ids"] == free[: k + 1]  # the stop token is an output id


def test_finish_reason_stop_on_a_string_says_the_string(engine: str, prompt: list[int]) -> None:
    # A regex fixes the text (this model's own greedy text is mostly padded ids on SGLang, which
    # decode to nothing); the stop string then ends it.
    params = {"regex": "Paris is nice and warm", "stop": ["nice"]}
    out = greedy(engine, prompt, 16, **params)
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "nice"}
    assert out["text"] == "Paris is "  # the matched string is trimmed from the text


def test_an_aborted_request_finishes_with_abort(engine: str, prompt: list[int]) -> None:
    rid = f"conformance-abort-{time.time_ns()}"
    params = {"max_new_tokens": 4000, "ignore_eos": True, "temperature": 1.0}
    got: dict[str, Any] = {}
    running = threading.Event()  # the abort goes out once the engine has streamed a token: it is running

    def run() -> None:
        body = {"input_ids": prompt, "rid": rid, "sampling_params": params, "stream": True}
        with httpx.stream("POST", engine + "/generate", json=body, timeout=120) as r:
            got["status"] = r.status_code
            for line in r.iter_lines():
                if line.startswith("data:") and line.strip() != "data: [DONE]":
                    got["last"] = orjson.loads(line[5:])
                    running.set()
        running.set()

    thread = threading.Thread(target=run)
    thread.start()
    assert running.wait(120), "the engine streamed nothing"
    assert httpx.post(engine + "/abort_request", json={"rid": rid}, timeout=30).status_code == 200
    thread.join(60)
    assert got["status"] == 200
    meta = got["last"]["meta_info"]
    assert meta["finish_reason"]["type"] == "abort" and meta["completion_tokens"] < 4000


# -- logprob semantics -------------------------------------------------------------------------------


def test_logprobs_are_normalized_over_the_padded_vocabulary(
    engine: str, prompt: list[int], reference: Any
) -> None:
    out = greedy(engine, prompt, 8)
    ids = prompt + out["output_ids"]
    expected = _expected(reference(ids), ids, len(prompt))
    np.testing.assert_allclose(_scores(out["meta_info"]), expected, atol=1e-4)


def test_sampled_logprobs_are_of_logits_over_the_temperature(
    engine: str, prompt: list[int], reference: Any
) -> None:
    params = {"max_new_tokens": 8, "temperature": 0.7}
    out = generate(engine, prompt, sampling_params=params, return_logprob=True)
    ids = prompt + out["output_ids"]
    expected = _expected(reference(ids), ids, len(prompt), temperature=0.7)
    np.testing.assert_allclose(_scores(out["meta_info"]), expected, atol=1e-4)


def test_teacher_forced_logprobs_are_of_the_raw_logits_at_any_temperature(
    engine: str, prompt: list[int], reference: Any
) -> None:
    params = {"max_new_tokens": 1, "temperature": 0.7}
    out = generate(engine, prompt, sampling_params=params, return_logprob=True, logprob_start_len=0)
    rows = out["meta_info"]["input_token_logprobs"]
    assert len(rows) == len(prompt) and rows[0][0] is None and [r[1] for r in rows] == prompt
    expected = _expected(reference(prompt), prompt, 1)
    np.testing.assert_allclose(_scores({"rows": rows[1:]}, "rows"), expected, atol=1e-4)


# -- seeds ---------------------------------------------------------------------------------------------


def test_the_server_says_whether_it_honours_sampling_seed(engine: str, prompt: list[int]) -> None:
    honoured = httpx.get(engine + "/server_info", timeout=30).json()["enable_deterministic_inference"]
    # SGLang applies a request's sampling_seed only with --enable-deterministic-inference, which its
    # CPU attention backends refuse; the embedded engine always applies it.
    assert honoured is {"embedded": True, "sglang": False}[_kind(engine)]
    if honoured:
        params = {"max_new_tokens": 12, "temperature": 1.0, "sampling_seed": 7}
        outs = {tuple(generate(engine, prompt, sampling_params=params)["output_ids"]) for _ in range(3)}
        assert len(outs) == 1


# -- errors --------------------------------------------------------------------------------------------


def test_an_unknown_sampling_key_is_a_400_with_a_string_error(engine: str, prompt: list[int]) -> None:
    body = generate(engine, prompt, 400, sampling_params={"max_new_tokens": 2, "seed": 3})
    assert isinstance(body["error"], str) and "unknown field `seed`" in body["error"]


def test_a_bad_sampling_value_is_a_400_with_an_error_message(engine: str, prompt: list[int]) -> None:
    body = generate(engine, prompt, 400, sampling_params={"max_new_tokens": 2, "top_p": 0.0})
    assert isinstance(body["error"]["message"], str) and "top_p" in body["error"]["message"]


# -- pause, flush, prefix cache, weights ---------------------------------------------------------------


def test_a_request_sent_while_paused_runs_after_continue(engine: str, prompt: list[int]) -> None:
    r = httpx.post(engine + "/pause_generation", json={"mode": "in_place"}, timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "ok"
    got: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: got.update(out=greedy(engine, prompt, 4)))
    thread.start()
    time.sleep(1.5)
    assert "out" not in got  # held while paused
    r = httpx.post(engine + "/continue_generation", json={}, timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "ok"
    thread.join(60)
    assert got["out"]["meta_info"]["finish_reason"]["type"] == "length"


def test_a_repeated_prompt_is_cached_until_the_cache_is_flushed(engine: str) -> None:
    ids = [
        int(i)
        for i in torch.randint(
            10, 4000, (64,), generator=torch.Generator().manual_seed(time.time_ns() % 1000)
        )
    ]
    assert greedy(engine, ids, 2)["meta_info"]["cached_tokens"] == 0
    assert greedy(engine, ids, 2)["meta_info"]["cached_tokens"] == 63  # all but the last prompt token
    assert httpx.post(engine + "/flush_cache", timeout=30).status_code == 200
    assert greedy(engine, ids, 2)["meta_info"]["cached_tokens"] == 0


def test_a_weight_update_from_disk_sets_the_reported_version(
    engine: str, model: Path, prompt: list[int]
) -> None:
    before = greedy(engine, prompt, 6)
    version = f"conformance-{time.time_ns()}"
    body = {"model_path": str(model), "weight_version": version}
    r = httpx.post(engine + "/update_weights_from_disk", json=body, timeout=120)
    assert r.status_code == 200 and r.json()["success"] is True
    after = greedy(engine, prompt, 6)
    assert after["meta_info"]["weight_version"] == version
    assert after["output_ids"] == before["output_ids"]  # the same weights: the same greedy tokens
