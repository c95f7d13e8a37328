"""The prefix cache inside the engine: a growing agent loop gives the same ids and logprobs with the
cache as without it (tiny Qwen3 fixture and a tiny Llama, the architecture SmolLM2 uses), and every
invalidation holds: weight updates (also one that lands while a request is paused in place), flush,
abort, divergence, and LRU eviction under a tiny `--cache-mib` over real HTTP; the flag on `rlgw engine`
and `rlgw serve`."""

from __future__ import annotations

import asyncio
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from rlgw.engine.core import Engine, EngineConfig
from rlgw.engine.request import Request
from rlgw.engine.sampling import parse_sampling_params
from tests.engine.conftest import run_requests
from tests.support.procs import FIXTURES, engine_server, free_port, rlgw_process

GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
SEEDED = {"max_new_tokens": 12, "temperature": 1.0, "sampling_seed": 11, "ignore_eos": True}
# Tokens the tiny fixtures' tokenizer knows (ids below 100 are left alone: nothing special there).
LOW, HIGH = 100, 4000


def build_tiny_llama(path: Path) -> Path:
    """A random 2-layer LlamaForCausalLM shaped like SmolLM2 (GQA, tied embeddings), with the tiny
    fixture's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=4096,
        hidden_size=96,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        bos_token_id=4000,
        eos_token_id=4002,
        pad_token_id=4000,
    )
    torch.manual_seed(3)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(10.0)  # sharper logits: greedy is meaningful
    model.save_pretrained(path, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES / "tiny-qwen3" / name, path / name)
    return path


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def engines(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """(cache on, cache off) in-process engines on one model; small prefill chunks, so a cached
    prefix is followed by chunked prefill."""
    path = FIXTURES / "tiny-qwen3"
    if request.param == "llama":
        path = build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
    on = Engine(path, EngineConfig(max_running=8, chunked_prefill_size=48))
    off = Engine(path, EngineConfig(max_running=8, chunked_prefill_size=48, cache_mib=0))
    yield on, off
    on.shutdown()
    off.shutdown()


def tokens(rng: random.Random, n: int, high: int = HIGH) -> list[int]:
    return [rng.randrange(LOW, high) for _ in range(n)]


def close(a: float, b: float, tol: float = 1e-5) -> bool:
    """Within `tol`, relative beyond magnitude 1: fp32's spacing near -68 is already 7.6e-6, and a
    cached prefix's KV comes from another kernel shape (batched decode) than a fresh prefill's."""
    return abs(a - b) <= tol * max(1.0, abs(b))


def assert_same(cached: Request, plain: Request, tol: float = 1e-5) -> None:
    """Same ids; logprobs within `tol` (output and prompt)."""
    assert cached.output_ids == plain.output_ids
    for a, b in zip(cached.output_logprobs, plain.output_logprobs, strict=True):
        assert close(a, b, tol), (a, b)
    assert len(cached.input_logprobs) == len(plain.input_logprobs)
    for a, b in zip(cached.input_logprobs[1:], plain.input_logprobs[1:], strict=True):
        assert close(a, b, tol), (a, b)


async def check_agent_loop(
    on: Engine, off: Engine, turns: int, start: tuple[int, int], vocab: int, tol: float = 1e-5
) -> None:
    """Two sessions grow turn by turn on both engines: same ids and logprobs, and each turn with the
    cache reuses exactly the previous turn's KV."""
    on.flush_cache()
    rng = random.Random(0)
    # Two sessions of different lengths decode together: their KV comes out of a left-padded batch.
    histories = [tokens(rng, n, vocab) for n in start]
    kept = [0, 0]
    for turn in range(turns):
        got = {}
        for name, engine in (("on", on), ("off", off)):
            runs = [run_requests(engine, h, [GREEDY, SEEDED], return_logprob=True) for h in histories]
            got[name] = await asyncio.gather(*runs)
        for s, (cached, plain) in enumerate(zip(got["on"], got["off"], strict=True)):
            for c, p in zip(cached, plain, strict=True):
                assert_same(c, p, tol)
                assert p.cached_tokens == 0
            # The greedy and seeded samples ran together; each reuses the previous turn's KV.
            assert [c.cached_tokens for c in cached] == [kept[s]] * 2
            greedy_req = cached[0]
            kept[s] = len(greedy_req.input_ids) + len(greedy_req.output_ids) - 1
            histories[s] = histories[s] + greedy_req.output_ids + tokens(rng, 40 + 20 * turn, vocab)


async def test_agent_loop_is_identical_with_and_without_the_cache(engines) -> None:
    await check_agent_loop(*engines, turns=4, start=(150, 90), vocab=HIGH)


@pytest.mark.slow
@pytest.mark.smollm2
async def test_agent_loop_on_smollm2_is_identical_with_and_without_the_cache() -> None:
    from rlgw.engine.models import ModelResolutionError, resolve_model

    try:
        path = resolve_model("smollm2")
    except ModelResolutionError as exc:
        pytest.skip(str(exc))
    on = Engine(path, EngineConfig(max_running=8, chunked_prefill_size=128))
    off = Engine(path, EngineConfig(max_running=8, chunked_prefill_size=128, cache_mib=0))
    try:
        # 30 layers of fp32: with no cache at all, one request's logprobs already move by up to 7.2e-6
        # between running alone and batched with two others (measured); a cached prefix's KV comes
        # from a decode batch whose make-up depends on timing, and one run here gave 2.0e-5.
        await check_agent_loop(on, off, turns=3, start=(300, 200), vocab=49000, tol=5e-5)
    finally:
        on.shutdown()
        off.shutdown()


async def test_prompt_logprobs_are_computed_not_reused(engines) -> None:
    on, off = engines
    rng = random.Random(1)
    prompt = tokens(rng, 120)
    await run_requests(on, prompt, [GREEDY])
    longer = prompt + tokens(rng, 30)
    start = 100
    (cached,) = await run_requests(on, longer, [GREEDY], return_logprob=True, logprob_start_len=start)
    (plain,) = await run_requests(off, longer, [GREEDY], return_logprob=True, logprob_start_len=start)
    assert cached.cached_tokens == start
    assert len(cached.input_logprobs) == len(longer) - start
    assert_same(cached, plain)


async def test_a_request_diverging_inside_a_cached_prefix_reuses_only_the_shared_part(engines) -> None:
    on, off = engines
    rng = random.Random(2)
    first = tokens(rng, 100)
    await run_requests(on, first, [GREEDY])
    forked = first[:60] + [t + 1 if t + 1 < HIGH else LOW for t in first[60:]]
    (cached,) = await run_requests(on, forked, [GREEDY], return_logprob=True)
    (plain,) = await run_requests(off, forked, [GREEDY], return_logprob=True)
    assert cached.cached_tokens == 60
    assert_same(cached, plain)
    (again,) = await run_requests(on, [*first, LOW], [GREEDY])  # the original path is still whole
    assert again.cached_tokens == len(first)


async def test_flush_drops_the_cache(engines) -> None:
    on, _ = engines
    prompt = tokens(random.Random(3), 80)
    await run_requests(on, prompt, [GREEDY])
    assert on.prefix.stats()["cached_tokens"] > 0
    assert on.flush_cache()
    assert on.prefix.stats()["cached_tokens"] == 0
    (again,) = await run_requests(on, prompt, [GREEDY])
    assert again.cached_tokens == 0


async def start_streaming(
    engine: Engine, rid: str, prompt: list[int], max_new_tokens: int
) -> tuple[Request, asyncio.Event]:
    """Submit a greedy streaming request; returns once it has produced a token, with its done event."""
    loop = asyncio.get_running_loop()
    started, done = asyncio.Event(), asyncio.Event()

    def sink(update) -> None:
        loop.call_soon_threadsafe((done if update.finish_reason else started).set)

    params = parse_sampling_params({"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0})
    req = Request(rid=rid, input_ids=prompt, params=params, sink=sink, stream=True)
    engine.submit([req])
    await asyncio.wait_for(started.wait(), 60)
    return req, done


async def test_an_aborted_request_leaves_nothing(engines) -> None:
    on, _ = engines
    on.flush_cache()
    prompt = tokens(random.Random(4), 200)
    req, done = await start_streaming(on, "abort-me", prompt, 2000)
    on.abort("abort-me")
    await asyncio.wait_for(done.wait(), 60)
    assert req.finish_reason["type"] == "abort" and req.output_ids
    assert on.prefix.stats()["cached_tokens"] == 0
    (again,) = await run_requests(on, prompt, [GREEDY])
    assert again.cached_tokens == 0


def _perturbed(engine: Engine, scale: float) -> list[tuple[str, torch.Tensor]]:
    return [
        (n, t.detach().clone() * scale)
        for n, t in engine.model.state_dict().items()
        if n.endswith("norm.weight")
    ]


async def test_a_weight_update_drops_the_cache(engines) -> None:
    on, off = engines
    prompt = tokens(random.Random(5), 80)
    await run_requests(on, prompt, [GREEDY])
    originals = [(n, t.detach().clone()) for n, t in on.model.state_dict().items()]
    try:
        await on.update_weights(_perturbed(on, 1.5), "v-next")
        await off.update_weights(_perturbed(off, 1.5), "v-next")
        assert on.prefix.stats()["cached_tokens"] == 0
        (cached,) = await run_requests(on, [*prompt, LOW], [GREEDY], return_logprob=True)
        (plain,) = await run_requests(off, [*prompt, LOW], [GREEDY], return_logprob=True)
        assert cached.cached_tokens == 0
        assert_same(cached, plain)
    finally:
        await on.update_weights(originals, "default")
        await off.update_weights(originals, "default")


async def test_a_request_straddling_a_weight_update_keeps_only_new_weight_kv(engines) -> None:
    """Paused in place, a running request holds old-weight KV when an update lands: the update
    re-prefills it, so what it leaves in the cache serves the new weights exactly."""
    on, off = engines
    on.flush_cache()
    prompt = tokens(random.Random(6), 60)
    originals = [(n, t.detach().clone()) for n, t in on.model.state_dict().items()]
    req, done = await start_streaming(on, "straddle", prompt, 300)
    await on.pause("in_place")
    try:
        await on.update_weights(_perturbed(on, 1.5), "v-next")
        await off.update_weights(_perturbed(off, 1.5), "v-next")
    finally:
        await on.resume()
    try:
        await asyncio.wait_for(done.wait(), 120)
        assert req.finish_reason == {"type": "length", "length": 300} and req.num_retractions == 0
        follow_up = prompt + req.output_ids + [LOW]
        (cached,) = await run_requests(on, follow_up, [GREEDY], return_logprob=True)
        (plain,) = await run_requests(off, follow_up, [GREEDY], return_logprob=True)
        assert cached.cached_tokens == len(prompt) + 300 - 1
        assert_same(cached, plain)
    finally:
        await on.update_weights(originals, "default")
        await off.update_weights(originals, "default")


def test_eviction_under_a_tiny_cache_mib_over_http() -> None:
    """1 MiB holds 2048 tokens of the fixture's KV (512 bytes a token): the third session of 900
    evicts the least recently used one; meta_info reports what was reused."""
    rng = random.Random(7)
    sessions = [tokens(rng, 900) for _ in range(3)]
    body = {"sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}}
    with engine_server(FIXTURES / "tiny-qwen3", "--cache-mib", "1") as url:

        def cached(ids: list[int]) -> int:
            r = httpx.post(f"{url}/generate", json={**body, "input_ids": ids}, timeout=120)
            assert r.status_code == 200, r.text
            return r.json()["meta_info"]["cached_tokens"]

        assert [cached(s) for s in sessions[:2]] == [0, 0]
        assert cached(sessions[0] + [LOW]) == 900  # session 0 is now the more recent
        assert cached(sessions[2]) == 0  # 3 x 900 > 2048: session 1's leaf goes
        stats = httpx.get(f"{url}/server_info").json()["prefix_cache"]
        assert stats["cached_bytes"] <= stats["max_bytes"] == 1 << 20
        assert stats["evicted_tokens"] > 0
        assert cached(sessions[1] + [LOW]) == 0
        assert cached(sessions[2] + [LOW]) == 900


@pytest.mark.slow  # starts the gateway and its engine: about 15 s on an idle 2-core box
def test_cache_mib_reaches_the_engine_rlgw_serve_embeds(tmp_path: Path) -> None:
    port, engine_port = free_port(), free_port()
    args = ["serve", "--model", str(FIXTURES / "tiny-qwen3"), "--port", str(port)]
    args += ["--engine-port", str(engine_port), "--cache-mib", "3", "--data-dir", str(tmp_path)]
    with rlgw_process(args, "/health", port):
        stats = httpx.get(f"http://127.0.0.1:{engine_port}/server_info").json()["prefix_cache"]
    assert stats["max_bytes"] == 3 << 20


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["engine", "--model", "x", "--cache-mib", "-1"], "--cache-mib must be at least 0"),
        (["serve", "--engine-url", "http://127.0.0.1:9", "--cache-mib", "8"], "not with --engine-url"),
    ],
)
def test_a_bad_cache_mib_is_refused_before_anything_loads(args: list[str], message: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rlgw.bin.main", *args, "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and message in out.stderr
