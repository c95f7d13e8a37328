"""Protocol conformance of a real `rlgw engine` subprocess (tiny random Qwen3 with the real tokenizer).

Shapes and finish reasons follow `docs/SGLANG_PROTOCOL.md`; logprobs are checked against
teacher forcing of the same tokens; abort, pause/continue, queue bounds and errors end to end.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from pathlib import Path

import httpx
import orjson
import pytest
from transformers import AutoTokenizer

PROMPT = [9707, 1052, 11, 1246, 525, 498, 30]  # "Hello there, how are you?"
IM_END = 151645
# As long as the test model's 512 positions allow: the window in which a test acts on a running
# request must not depend on how fast the machine is.
LONG = {"max_new_tokens": 480, "ignore_eos": True, "temperature": 0}


def gen(url: str, body: dict, timeout: float = 60.0) -> httpx.Response:
    return httpx.post(f"{url}/generate", json=body, timeout=timeout)


def greedy(url: str, prompt: list[int], n: int = 12, **extra) -> dict:
    r = gen(url, {"input_ids": prompt, "sampling_params": {"max_new_tokens": n, "temperature": 0}, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def sse_events(response: httpx.Response):
    for line in response.iter_lines():
        if not line:
            continue
        assert line.startswith("data: "), line
        payload = line[len("data: ") :]
        yield None if payload == "[DONE]" else orjson.loads(payload)


# -- shapes and finish reasons ---------------------------------------------------------------------


def test_single_response_shape(engine_url: str, tiny_model: Path) -> None:
    # Earlier tests on this engine sent the same prompt: its KV would come from the prefix cache.
    assert httpx.post(engine_url + "/flush_cache", timeout=30).status_code == 200
    out = greedy(engine_url, PROMPT, 6, return_logprob=True)
    assert set(out) == {"text", "output_ids", "meta_info"}
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]) == (len(PROMPT), 6, 0)
    assert meta["weight_version"] == "default"
    assert isinstance(meta["id"], str) and len(meta["id"]) == 32
    assert meta["e2e_latency"] > 0
    assert len(out["output_ids"]) == 6
    assert [t[1] for t in meta["output_token_logprobs"]] == out["output_ids"]
    assert all(t[2] is None and t[0] <= 0 for t in meta["output_token_logprobs"])
    assert meta["output_token_logprobs_length"] == 6
    assert meta["input_token_logprobs"] == []
    assert out["text"] == AutoTokenizer.from_pretrained(str(tiny_model)).decode(out["output_ids"])


def test_text_input_and_client_rid(engine_url: str) -> None:
    r = gen(engine_url, {"text": "Hello there", "rid": "my-rid", "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200
    meta = r.json()["meta_info"]
    assert meta["id"] == "my-rid" and meta["prompt_tokens"] == 2


def test_batch_and_n(engine_url: str) -> None:
    body = {
        "input_ids": [PROMPT, PROMPT[:3]],
        "rid": "b",
        "sampling_params": {"max_new_tokens": 3, "temperature": 0},
    }
    outs = gen(engine_url, body).json()
    assert [o["meta_info"]["id"] for o in outs] == ["b_0", "b_1"]
    assert [o["meta_info"]["prompt_tokens"] for o in outs] == [len(PROMPT), 3]
    assert outs[0]["output_ids"] == greedy(engine_url, PROMPT, 3)["output_ids"]

    body = {
        "input_ids": [PROMPT, PROMPT[:3]],
        "sampling_params": {"max_new_tokens": 3, "n": 2, "temperature": 0},
    }
    outs = gen(engine_url, body).json()
    assert len(outs) == 4 and len({o["meta_info"]["id"] for o in outs}) == 4
    # A prompt's n samples are adjacent, prompts keep their order.
    assert [o["meta_info"]["prompt_tokens"] for o in outs] == [len(PROMPT), len(PROMPT), 3, 3]
    assert "index" not in outs[0]

    single_n = gen(engine_url, {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, "n": 2}}).json()
    assert isinstance(single_n, list) and len(single_n) == 2


def test_stop_token_and_stop_string(engine_url: str) -> None:
    ref = greedy(engine_url, PROMPT, 12)
    ids = ref["output_ids"]
    target = ids[4]
    first = ids.index(target)
    out = greedy(
        engine_url,
        PROMPT,
        12,
        sampling_params={"max_new_tokens": 12, "temperature": 0, "stop_token_ids": [target]},
    )
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": target}
    assert out["output_ids"] == ids[: first + 1]  # output_ids include the matched stop token
    assert out["meta_info"]["completion_tokens"] == first + 1

    # A stop string taken from the reference text: generation ends there and the text is trimmed.
    tok_text = httpx.post(
        f"{engine_url}/generate",
        json={
            "input_ids": PROMPT,
            "sampling_params": {"max_new_tokens": 12, "temperature": 0},
            "return_logprob": True,
            "return_text_in_logprobs": True,
        },
    ).json()["meta_info"]["output_token_logprobs"]
    pieces = [t[2] for t in tok_text]
    k = next(i for i in range(3, 12) if pieces[i].strip() and pieces[i] not in "".join(pieces[:i]))
    stop = pieces[k]
    out = gen(
        engine_url,
        {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 12, "temperature": 0, "stop": [stop]}},
    ).json()
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["output_ids"] == ids[: k + 1]
    assert out["text"] == "".join(pieces[:k])
    kept = gen(
        engine_url,
        {
            "input_ids": PROMPT,
            "sampling_params": {"max_new_tokens": 12, "temperature": 0, "stop": stop, "no_stop_trim": True},
        },
    ).json()
    assert kept["text"] == "".join(pieces[: k + 1])


def test_eos_handling(engine_url: str) -> None:
    force_eos = {"temperature": 0, "max_new_tokens": 6, "logit_bias": {str(IM_END): 100.0}}
    out = gen(engine_url, {"input_ids": PROMPT, "sampling_params": force_eos}).json()
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": IM_END}
    assert out["output_ids"] == [IM_END] and out["text"] == ""
    raw = gen(
        engine_url,
        {
            "input_ids": PROMPT,
            "sampling_params": {**force_eos, "skip_special_tokens": False, "no_stop_trim": True},
        },
    ).json()
    assert raw["text"] == "<|im_end|>"
    ignored = gen(
        engine_url, {"input_ids": PROMPT, "sampling_params": {**force_eos, "ignore_eos": True}}
    ).json()
    assert ignored["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    assert ignored["output_ids"] == [IM_END] * 6
    delayed = gen(
        engine_url, {"input_ids": PROMPT, "sampling_params": {**force_eos, "min_new_tokens": 3}}
    ).json()
    assert len(delayed["output_ids"]) == 4 and delayed["output_ids"][-1] == IM_END
    assert IM_END not in delayed["output_ids"][:3]


def test_streaming_chunks_are_cumulative(engine_url: str) -> None:
    body = {
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": 8, "temperature": 0},
        "stream": True,
        "return_logprob": True,
    }
    with httpx.stream("POST", f"{engine_url}/generate", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(r))
    assert events[-1] is None and None not in events[:-1]
    chunks = events[:-1]
    assert len(chunks) == 8
    for i, c in enumerate(chunks, 1):
        assert len(c["output_ids"]) == i == c["meta_info"]["completion_tokens"]
        assert len(c["meta_info"]["output_token_logprobs"]) == i
        assert "index" not in c
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert "e2e_latency" in chunks[-1]["meta_info"] and "e2e_latency" not in chunks[0]["meta_info"]
    final = greedy(engine_url, PROMPT, 8)
    assert chunks[-1]["output_ids"] == final["output_ids"] and chunks[-1]["text"] == final["text"]
    for a, b in itertools.pairwise(chunks):
        assert b["output_ids"][: len(a["output_ids"])] == a["output_ids"]


def test_streaming_batch_has_index(engine_url: str) -> None:
    body = {"input_ids": [PROMPT, PROMPT[:2]], "sampling_params": {"max_new_tokens": 3}, "stream": True}
    with httpx.stream("POST", f"{engine_url}/generate", json=body, timeout=60) as r:
        chunks = [e for e in sse_events(r) if e is not None]
    assert {c["index"] for c in chunks} == {0, 1}
    assert sum(c["meta_info"]["finish_reason"] is not None for c in chunks) == 2


# -- logprobs and determinism ----------------------------------------------------------------------


async def test_output_logprobs_equal_teacher_forced(engine_url: str) -> None:
    prompts = [PROMPT, PROMPT[:3], [*PROMPT, *PROMPT], PROMPT[2:]]
    async with httpx.AsyncClient(base_url=engine_url, timeout=60) as client:
        # Concurrent, so decode runs batched with left padding across different lengths.
        outs = await asyncio.gather(
            *[
                client.post(
                    "/generate",
                    json={
                        "input_ids": p,
                        "return_logprob": True,
                        "top_logprobs_num": 3,
                        "sampling_params": {"max_new_tokens": 24, "temperature": 1.0, "sampling_seed": i},
                    },
                )
                for i, p in enumerate(prompts)
            ]
        )
        for p, r in zip(prompts, outs, strict=True):
            out = r.json()
            sampled = out["meta_info"]["output_token_logprobs"]
            tf = (
                await client.post(
                    "/generate",
                    json={
                        "input_ids": p + out["output_ids"],
                        "return_logprob": True,
                        "logprob_start_len": len(p) - 1,
                        "top_logprobs_num": 3,
                        "sampling_params": {"max_new_tokens": 0},
                    },
                )
            ).json()
            assert tf["output_ids"] == [] and tf["meta_info"]["finish_reason"] == {
                "type": "length",
                "length": 0,
            }
            forced = tf["meta_info"]["input_token_logprobs"]
            assert forced[0][0] is None and forced[0][1] == p[-1]
            assert [t[1] for t in forced[1:]] == out["output_ids"]
            for (a, _, _), (b, _, _) in zip(sampled, forced[1:], strict=True):
                assert abs(a - b) < 1e-4
            tops = out["meta_info"]["output_top_logprobs"]
            assert len(tops) == len(sampled) and all(len(row) == 3 for row in tops)
            forced_tops = tf["meta_info"]["input_top_logprobs"]
            assert forced_tops[0] is None
            assert [[t[1] for t in row] for row in forced_tops[1:]] == [[t[1] for t in row] for row in tops]


async def test_same_seed_same_output(engine_url: str) -> None:
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 16, "sampling_seed": 1234}}
    async with httpx.AsyncClient(base_url=engine_url, timeout=60) as client:
        alone = (await client.post("/generate", json=body)).json()["output_ids"]
        noise = {"input_ids": PROMPT[:4], "sampling_params": {"max_new_tokens": 20}}
        together = await asyncio.gather(
            client.post("/generate", json=body),
            client.post("/generate", json=noise),
            client.post("/generate", json=noise),
        )
        other = (
            await client.post(
                "/generate", json={**body, "sampling_params": {"max_new_tokens": 16, "sampling_seed": 99}}
            )
        ).json()
    assert together[0].json()["output_ids"] == alone
    assert other["output_ids"] != alone


# -- abort, pause, queue ---------------------------------------------------------------------------


def test_abort_mid_generation_streaming(engine_url: str) -> None:
    body = {"input_ids": PROMPT, "rid": "to-abort", "sampling_params": LONG, "stream": True}
    with httpx.stream("POST", f"{engine_url}/generate", json=body, timeout=60) as r:
        events = sse_events(r)
        for _ in range(3):
            next(events)
        assert httpx.post(f"{engine_url}/abort_request", json={"rid": "to-abort"}).status_code == 200
        rest = list(events)
    assert rest[-1] is None
    last = rest[-2]
    assert last["meta_info"]["finish_reason"] == {
        "type": "abort",
        "message": "Aborted",
        "status_code": None,
        "err_type": None,
    }
    n = len(last["output_ids"])
    assert 3 <= n < 480 and last["meta_info"]["completion_tokens"] == n
    assert (
        last["output_ids"] == greedy(engine_url, PROMPT, n)["output_ids"]
    )  # the partial output is the real prefix


def wait_running(url: str, timeout: float = 30.0) -> None:
    """Return once the engine has a request decoding (instead of sleeping a guessed time)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = httpx.get(f"{url}/server_info").json()["internal_states"][0]
        if state["num_running"] > 0:
            time.sleep(0.05)  # a few decode steps, so the partial output is not empty
            return
        time.sleep(0.01)
    pytest.fail("no request started running")


def test_abort_mid_generation_non_streamed(engine_url: str) -> None:
    result: dict = {}

    def call() -> None:
        result["out"] = gen(
            engine_url, {"input_ids": PROMPT, "rid": "ns-abort", "sampling_params": LONG}
        ).json()

    t = threading.Thread(target=call)
    t.start()
    wait_running(engine_url)
    httpx.post(f"{engine_url}/abort_request", json={"abort_all": True})
    t.join(30)
    meta = result["out"]["meta_info"]
    assert meta["finish_reason"]["type"] == "abort" and meta["finish_reason"]["message"] == "Aborted"
    assert 0 < meta["completion_tokens"] < 480


def test_pause_abort_mode_and_waiting_queue_abort(engine_url: str) -> None:
    result: dict = {}
    t = threading.Thread(
        target=lambda: result.update(
            running=gen(engine_url, {"input_ids": PROMPT, "sampling_params": LONG}).json()
        )
    )
    t.start()
    wait_running(engine_url)
    r = httpx.post(f"{engine_url}/pause_generation", json={"mode": "abort"}, timeout=30)
    assert r.json() == {"message": "Generation paused successfully.", "status": "ok"}
    t.join(30)
    assert result["running"]["meta_info"]["finish_reason"]["type"] == "abort"
    try:
        # New requests wait while paused; one aborted in the queue says so and has no prompt counts.
        waiter = threading.Thread(
            target=lambda: result.update(
                queued=gen(
                    engine_url,
                    {"input_ids": PROMPT, "rid": "queued", "sampling_params": {"max_new_tokens": 2}},
                ).json()
            )
        )
        waiter.start()
        waiter.join(1.0)
        assert waiter.is_alive()
        httpx.post(f"{engine_url}/abort_request", json={"rid": "queued"})
        waiter.join(10)
        meta = result["queued"]["meta_info"]
        assert meta["finish_reason"] == {"type": "abort", "message": "Abort in waiting queue"}
        assert "prompt_tokens" not in meta and "cached_tokens" not in meta
        assert result["queued"]["output_ids"] == []

        later = threading.Thread(target=lambda: result.update(later=greedy(engine_url, PROMPT, 4)))
        later.start()
        later.join(1.0)
        assert later.is_alive()
        assert httpx.get(f"{engine_url}/ready").status_code == 503
    finally:
        r = httpx.post(f"{engine_url}/continue_generation", json={})
    assert r.json() == {"message": "Generation continued successfully.", "status": "ok"}
    later.join(30)
    assert result["later"]["meta_info"]["finish_reason"] == {"type": "length", "length": 4}


@pytest.mark.parametrize(("mode", "flush"), [("in_place", False), ("in_place", True), ("retract", True)])
def test_pause_keeps_requests_and_output_is_unchanged(engine_url: str, mode: str, flush: bool) -> None:
    n = 60
    ref = greedy(engine_url, PROMPT, n, return_logprob=True)
    body = {
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": n, "temperature": 0},
        "stream": True,
        "return_logprob": True,
    }
    with httpx.stream("POST", f"{engine_url}/generate", json=body, timeout=60) as r:
        events = sse_events(r)
        for _ in range(5):
            next(events)
        httpx.post(f"{engine_url}/pause_generation", json={"mode": mode}, timeout=30)
        try:
            time.sleep(0.3)
            if flush:  # drops the kept KV: the request is re-prefilled from prompt + output so far
                assert httpx.post(f"{engine_url}/flush_cache").status_code == 200
        finally:
            httpx.post(f"{engine_url}/continue_generation", json={})
        chunks = [e for e in events if e is not None]
    final = chunks[-1]
    assert final["meta_info"]["finish_reason"] == {"type": "length", "length": n}
    assert final["output_ids"] == ref["output_ids"]
    for a, b in zip(
        final["meta_info"]["output_token_logprobs"], ref["meta_info"]["output_token_logprobs"], strict=True
    ):
        assert abs(a[0] - b[0]) < 1e-4
    if mode == "retract":
        assert final["meta_info"]["num_retractions"] == 1


def test_flush_cache_refused_while_running(engine_url: str) -> None:
    started = threading.Event()

    def stream_long() -> None:
        body = {"input_ids": PROMPT, "sampling_params": {**LONG, "max_new_tokens": 480}, "stream": True}
        with httpx.stream("POST", f"{engine_url}/generate", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    started.set()

    t = threading.Thread(target=stream_long)
    t.start()
    # Flush as soon as the request is producing tokens (not after a fixed sleep, which a fast
    # machine outruns): hundreds of tokens are still to come.
    assert started.wait(30)
    try:
        assert httpx.post(f"{engine_url}/flush_cache").status_code == 400
    finally:
        httpx.post(f"{engine_url}/abort_request", json={"abort_all": True})
        t.join(30)
    r = httpx.get(f"{engine_url}/flush_cache")
    assert r.status_code == 200 and r.text.startswith("Cache flushed")


def wait_idle(url: str, timeout: float = 10.0) -> None:
    """Fail unless the engine has nothing running or waiting within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = httpx.get(f"{url}/server_info").json()["internal_states"][0]
        if state["num_running"] == 0 and state["num_waiting"] == 0:
            return
        time.sleep(0.2)
    pytest.fail(f"request still running after the client went away: {state}")


def test_client_disconnect_aborts(engine_url: str) -> None:
    with pytest.raises(httpx.ReadTimeout):
        gen(engine_url, {"input_ids": PROMPT, "sampling_params": LONG}, timeout=0.5)
    wait_idle(engine_url)


def test_streaming_client_disconnect_aborts(engine_url: str) -> None:
    body = {"input_ids": PROMPT, "sampling_params": LONG, "stream": True}
    with httpx.stream("POST", f"{engine_url}/generate", json=body, timeout=60) as r:
        events = sse_events(r)
        next(events)
        next(events)
    wait_idle(engine_url)


def test_queue_full_is_503_and_nothing_queued(engine_url: str) -> None:
    r = gen(engine_url, {"input_ids": [PROMPT] * 17, "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 503
    assert "queue is full" in r.json()["error"]["message"]
    assert httpx.get(f"{engine_url}/server_info").json()["internal_states"][0]["num_waiting"] == 0
    ok = gen(engine_url, {"input_ids": [PROMPT] * 16, "sampling_params": {"max_new_tokens": 1}})
    assert ok.status_code == 200 and len(ok.json()) == 16


# -- errors ----------------------------------------------------------------------------------------


def test_bad_requests(engine_url: str) -> None:
    r = gen(engine_url, {"input_ids": PROMPT, "sampling_params": {"seed": 1}})
    assert r.status_code == 400
    assert r.json()["error"].startswith("unknown field `seed`, expected one of")
    r = gen(engine_url, {"input_ids": PROMPT, "sampling_params": {"top_p": 0}})
    assert r.status_code == 400 and "top_p" in r.json()["error"]["message"]
    r = gen(engine_url, {"input_ids": PROMPT * 80})  # 560 tokens > 512 positions
    assert r.status_code == 400 and "context length" in r.json()["error"]["message"]
    r = gen(engine_url, {"input_ids": [10**9]})
    assert r.status_code == 400 and "out of range" in r.json()["error"]["message"]
    r = gen(engine_url, {"text": "a", "input_ids": [1]})
    assert r.status_code == 400
    r = httpx.post(f"{engine_url}/generate", content=b"{not json", timeout=10)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = gen(engine_url, {"input_ids": PROMPT, "return_logprob": True, "logprob_start_len": len(PROMPT)})
    assert r.status_code == 400
    # Unknown top-level keys are ignored, as SGLang does.
    assert (
        gen(
            engine_url, {"input_ids": PROMPT, "whatever": 1, "sampling_params": {"max_new_tokens": 1}}
        ).status_code
        == 200
    )


# -- control routes --------------------------------------------------------------------------------


def test_info_routes(engine_url: str) -> None:
    info = httpx.get(f"{engine_url}/model_info").json()
    assert info == httpx.get(f"{engine_url}/get_model_info").json()
    assert info["is_generation"] is True and info["weight_version"] == "default"
    assert info["max_context_length"] == 512 and info["architectures"] == ["Qwen3ForCausalLM"]
    assert (info["model_path"] and info["tokenizer_path"]) and info["served_model_name"]
    assert httpx.get(f"{engine_url}/get_weight_version").json() == {"weight_version": "default"}
    server = httpx.get(f"{engine_url}/server_info").json()
    assert "before top-k" in server["logprob_semantics"] and server["return_original_logprob"] is False
    assert server["max_running_requests"] == 8 and server["max_queued_requests"] == 16
    assert server["chunked_prefill_size"] == 16
    assert httpx.get(f"{engine_url}/health").status_code == 200
    assert httpx.get(f"{engine_url}/health_generate", timeout=30).status_code == 200


def test_prompt_logprobs_match_transformers(engine_url: str, tiny_model: Path) -> None:
    """Chunked prefill (16-token chunks here) scores a 100-token prompt like one plain forward."""
    import torch
    from transformers import AutoModelForCausalLM

    prompt = [(i * 7919) % 150000 for i in range(100)]
    start = 37
    body = {
        "input_ids": prompt,
        "return_logprob": True,
        "logprob_start_len": start,
        "top_logprobs_num": 2,
        "sampling_params": {"max_new_tokens": 0},
    }
    meta = gen(engine_url, body).json()["meta_info"]
    got = meta["input_token_logprobs"]
    assert len(got) == len(prompt) - start and got[0] == [None, prompt[start], None]
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    with torch.inference_mode():
        ref = torch.log_softmax(model(torch.tensor([prompt])).logits[0], -1)
    for j, (lp, tok, _) in enumerate(got[1:]):
        pos = start + j  # the hidden state at `pos` scores token pos + 1
        assert tok == prompt[pos + 1]
        assert abs(lp - float(ref[pos, tok])) < 1e-4
    tops = meta["input_top_logprobs"]
    assert tops[0] is None
    assert [row[0][1] for row in tops[1:]] == ref[start : len(prompt) - 1].argmax(-1).tolist()


async def test_long_prefill_does_not_stall_decoding(engine_url: str) -> None:
    """A 400-token prompt is prefilled in 16-token chunks with decode steps in between: a request
    that is already decoding keeps producing tokens meanwhile (one forward would allow about one)."""
    progress: list[int] = []
    b_started = asyncio.Event()
    a_at_b: list[int] = []

    async def read(client: httpx.AsyncClient, body: dict, on_chunk) -> None:
        async with client.stream("POST", "/generate", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    on_chunk(orjson.loads(line[6:]))

    a_running = asyncio.Event()

    def on_a(chunk: dict) -> None:
        progress.append(chunk["meta_info"]["completion_tokens"])
        if len(progress) >= 3:
            a_running.set()

    def on_b(chunk: dict) -> None:
        if not b_started.is_set():
            a_at_b.append(progress[-1])
            b_started.set()

    a_body = {"input_ids": PROMPT, "sampling_params": {**LONG, "max_new_tokens": 300}, "stream": True}
    b_body = {
        "input_ids": [(i * 31) % 150000 for i in range(400)],
        "stream": True,
        "sampling_params": {"max_new_tokens": 1},
    }
    async with httpx.AsyncClient(base_url=engine_url, timeout=120) as client:
        a = asyncio.create_task(read(client, a_body, on_a))
        await asyncio.wait_for(a_running.wait(), 60)
        before = progress[-1]
        await read(client, b_body, on_b)
        await client.post("/abort_request", json={"abort_all": True})
        await a
    assert a_at_b[0] - before >= 10, (before, a_at_b)
