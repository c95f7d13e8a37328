"""The engine client's policy (retries, error types, abort on cancel, stream reading) over an
in-process transport: scripted replies, no server (`gateway/engine_client/transport.py`'s seam)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest

from rlgw.gateway.engine_client.backend import SGLangBackend
from rlgw.gateway.engine_client.transport import ConnectFailed, HandlerTransport, ReadTimeout, TransportError
from rlgw.gateway.errors import (
    InvalidRequest,
    UpstreamAborted,
    UpstreamError,
    UpstreamOverloaded,
    UpstreamTimeout,
    UpstreamUnreached,
)


def _result(ids: list[int], finish: dict | None = None) -> dict:
    return {
        "meta_info": {
            "id": "rid",
            "finish_reason": finish if finish is not None else {"type": "stop", "matched": ids[-1]},
            "weight_version": "v3",
            "prompt_tokens": 2,
            "output_token_logprobs": [[-0.25 * (i + 1), t, None] for i, t in enumerate(ids)],
        }
    }


class Script:
    """Answers `/generate` from a list of steps; records every request."""

    def __init__(self, *steps: object) -> None:
        self.steps = list(steps)
        self.seen: list[tuple[str, str, dict | None]] = []

    async def __call__(
        self, method: str, path: str, body: bytes | None
    ) -> tuple[int, bytes | AsyncIterator[bytes]]:
        doc = orjson.loads(body) if body else None
        self.seen.append((method, path, doc))
        if path == "/abort_request":
            return 200, b""
        step = self.steps.pop(0)
        if isinstance(step, BaseException):
            raise step
        if step == "hang":
            await asyncio.sleep(30)
        if isinstance(step, tuple):
            return step
        return 200, orjson.dumps(step)

    @property
    def aborted(self) -> list[str]:
        return [d["rid"] for _, p, d in self.seen if p == "/abort_request" and d]


def backend(script: Script, retries: int = 2) -> SGLangBackend:
    return SGLangBackend("http://engine", transport=HandlerTransport(script), retries=retries)


async def test_a_request_never_sent_is_retried_then_served() -> None:
    script = Script(ConnectFailed("refused"), (503, b'{"error": {"message": "queue full"}}'), _result([5, 6]))
    result = await backend(script).generate([1, 2], {}, rid="r1", routing_key="s")
    assert result.output_ids == [5, 6] and result.logprobs == [-0.25, -0.5] and result.weight_version == "v3"
    assert [p for _, p, _ in script.seen] == ["/generate"] * 3


async def test_retries_exhausted_are_typed() -> None:
    with pytest.raises(UpstreamUnreached):
        await backend(Script(*[ConnectFailed("x")] * 3)).generate([1], {}, rid="r", routing_key="s")
    with pytest.raises(UpstreamOverloaded) as err:
        await backend(Script(*[(503, b"busy")] * 3)).generate([1], {}, rid="r", routing_key="s")
    assert err.value.status == 503


async def test_a_request_that_may_have_been_sent_is_not_retried() -> None:
    script = Script(ReadTimeout("slow"), _result([5]))
    with pytest.raises(UpstreamTimeout) as err:
        await backend(script).generate([1], {}, rid="r9", routing_key="s")
    assert err.value.status == 504
    assert [p for _, p, _ in script.seen] == ["/generate", "/abort_request"] and script.aborted == ["r9"]
    script = Script(TransportError("reset"))
    with pytest.raises(UpstreamError) as err2:
        await backend(script).generate([1], {}, rid="r", routing_key="s")
    assert type(err2.value) is UpstreamError and err2.value.status == 502


async def test_engine_errors_map_to_the_gateways() -> None:
    with pytest.raises(InvalidRequest, match="bad sampling"):
        await backend(Script((400, b'{"error": {"message": "bad sampling"}}'))).generate(
            [1], {}, rid="r", routing_key="s"
        )
    with pytest.raises(UpstreamError, match="500"):
        await backend(Script((500, b"boom"))).generate([1], {}, rid="r", routing_key="s")
    aborted = _result([5], {"type": "abort", "message": "paused"})
    with pytest.raises(UpstreamAborted):
        await backend(Script(aborted)).generate([1], {}, rid="r", routing_key="s")


async def test_a_cancelled_call_aborts_its_rid() -> None:
    script = Script("hang")
    task = asyncio.create_task(backend(script).generate([1], {}, rid="gone", routing_key="s"))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert script.aborted == ["gone"]


async def test_the_routing_key_and_body_reach_the_engine() -> None:
    seen: list[dict] = []

    async def handler(method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        seen.append(orjson.loads(body or b"{}"))
        return 200, orjson.dumps(_result([7]))

    b = SGLangBackend("http://engine", transport=HandlerTransport(handler))
    await b.generate([1, 2, 3], {"temperature": 0.5, "top_logprobs_num": 2}, rid="r", routing_key="sess")
    assert seen[0]["input_ids"] == [1, 2, 3] and seen[0]["top_logprobs_num"] == 2
    assert "top_logprobs_num" not in seen[0]["sampling_params"] and seen[0]["return_logprob"] is True


async def test_a_stream_yields_ids_with_their_logprobs_then_the_result() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield (
            b"data: "
            + orjson.dumps(_result([5], {})).replace(b'"finish_reason":{}', b'"finish_reason":null')
            + b"\n\n"
        )
        yield b"data: " + orjson.dumps(_result([5, 6, 7])) + b"\n\ndata: [DONE]\n\n"

    script = Script((200, chunks()))
    updates = [u async for u in backend(script).stream([1], {}, rid="r", routing_key="s")]
    assert [u.new_ids for u in updates] == [[5], [6, 7], []]
    assert updates[1].new_logprobs == [-0.5, -0.75]
    assert updates[-1].result is not None and updates[-1].result.output_ids == [5, 6, 7]


async def test_a_stream_that_ends_early_is_an_error_and_aborts() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield (
            b"data: "
            + orjson.dumps(_result([5], {})).replace(b'"finish_reason":{}', b'"finish_reason":null')
            + b"\n\n"
        )

    script = Script((200, chunks()))
    with pytest.raises(UpstreamError, match="ended before"):
        _ = [u async for u in backend(script).stream([1], {}, rid="cut", routing_key="s")]
    assert script.aborted == ["cut"]
