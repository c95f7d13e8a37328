"""Live weight updates: `/update_weights_from_disk` over HTTP, and the core's `update_weights` contract."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import save_file

from rlgw.engine.core import Engine, EngineConfig
from rlgw.engine.errors import WeightUpdateError
from rlgw.engine.request import Request
from rlgw.engine.sampling import parse_sampling_params
from rlgw.engine.weights import read_safetensors_dir
from tests.engine.conftest import run_requests

PROMPT = [9707, 1052, 11, 1246, 525, 498, 30]
GREEDY = {"max_new_tokens": 16, "temperature": 0}


@pytest.fixture(scope="module")
def core_b(tiny_model_b: Path) -> Iterator[Engine]:
    """An in-process engine core loaded directly from checkpoint B."""
    engine = Engine(tiny_model_b, EngineConfig(max_queue=8, max_running=4))
    yield engine
    engine.shutdown()


async def run_core(engine: Engine, prompt: list[int]) -> Request:
    """One greedy generation through the core API; returns the finished request."""
    return (await run_requests(engine, prompt, [GREEDY], return_logprob=True))[0]


async def generate(client: httpx.AsyncClient) -> dict:
    body = {"input_ids": PROMPT, "sampling_params": GREEDY, "return_logprob": True}
    r = await client.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


async def test_update_weights_from_disk(
    engine_url: str, tiny_model: Path, tiny_model_b: Path, core_b: Engine, tmp_path: Path
) -> None:
    assert (tiny_model_b / "model.safetensors.index.json").is_file()  # the sharded path is exercised
    ref_b = await run_core(core_b, PROMPT)
    async with httpx.AsyncClient(base_url=engine_url, timeout=120) as client:
        before = await generate(client)
        assert before["meta_info"]["weight_version"] == "default"
        assert before["output_ids"] != ref_b.output_ids
        try:
            r = await client.post(
                "/update_weights_from_disk", json={"model_path": str(tiny_model_b), "weight_version": "v2"}
            )
            assert r.status_code == 200
            assert r.json() == {
                "success": True,
                "message": "Succeeded to update model weights. Weight version updated to v2.",
                "num_paused_requests": 0,
            }
            after = await generate(client)
            # Exactly what a model loaded directly from checkpoint B produces.
            assert after["output_ids"] == ref_b.output_ids
            got = [t[0] for t in after["meta_info"]["output_token_logprobs"]]
            assert got == pytest.approx(ref_b.output_logprobs, abs=1e-6)
            assert after["meta_info"]["weight_version"] == "v2"
            assert (await client.get("/model_info")).json()["weight_version"] == "v2"
            assert (await client.get("/get_weight_version")).json() == {"weight_version": "v2"}

            # A checkpoint that does not fit is refused as a whole: nothing changes.
            bad = tmp_path / "bad"
            bad.mkdir()
            save_file(
                {"model.norm.weight": torch.ones(65), "lm_head.weight": torch.zeros(4)},
                str(bad / "x.safetensors"),
            )
            r = await client.post(
                "/update_weights_from_disk", json={"model_path": str(bad), "weight_version": "v3"}
            )
            assert r.status_code == 400 and r.json()["success"] is False
            assert "model.norm.weight" in r.json()["message"] and "lm_head.weight" in r.json()["message"]
            r = await client.post("/update_weights_from_disk", json={"model_path": str(tmp_path / "missing")})
            assert r.status_code == 400 and "does not exist" in r.json()["message"]
            unchanged = await generate(client)
            assert (
                unchanged["output_ids"] == ref_b.output_ids
                and unchanged["meta_info"]["weight_version"] == "v2"
            )
        finally:
            restore = {"model_path": str(tiny_model), "weight_version": "default"}
            assert (await client.post("/update_weights_from_disk", json=restore)).status_code == 200
        assert (await generate(client))["output_ids"] == before["output_ids"]


async def test_core_update_weights_contract(core_b: Engine, tiny_model: Path, tiny_model_b: Path) -> None:
    before = await run_core(core_b, PROMPT)
    version = core_b.weight_version
    norm = core_b.model.state_dict()["model.norm.weight"]
    for bad, needle in [
        ([("model.nope.weight", torch.zeros(3))], "unknown parameter"),
        ([("model.norm.weight", torch.zeros(65))], "shape"),
        ([("model.norm.weight", torch.zeros(64, dtype=torch.float16))], "dtype"),
        # One bad tensor spoils the whole update, even after a good one.
        ([("model.norm.weight", torch.zeros(64)), ("lm_head.weight", torch.zeros(2))], "lm_head.weight"),
    ]:
        with pytest.raises(WeightUpdateError, match=needle):
            await core_b.update_weights(bad, "never")
    assert core_b.weight_version == version
    assert torch.equal(core_b.model.state_dict()["model.norm.weight"], norm)
    assert (await run_core(core_b, PROMPT)).output_ids == before.output_ids

    # Applying A's tensors makes B generate like A; applying B's again restores it.
    await core_b.update_weights(read_safetensors_dir(tiny_model).items(), "a")
    as_a = await run_core(core_b, PROMPT)
    assert core_b.weight_version == "a" and as_a.output_ids != before.output_ids
    await core_b.load_weights_from_dir(tiny_model_b, None)
    assert core_b.weight_version == "a"  # None keeps the version string
    assert (await run_core(core_b, PROMPT)).output_ids == before.output_ids


async def test_update_waits_for_running_requests(core_b: Engine, tiny_model_b: Path) -> None:
    """An update without a pause lets running requests finish on the old weights first."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    versions: list[str] = []

    started = asyncio.Event()

    def sink(update) -> None:
        loop.call_soon_threadsafe(started.set)
        if update.finish_reason is not None:
            versions.append(update.weight_version)
            loop.call_soon_threadsafe(done.set)

    params = parse_sampling_params({"max_new_tokens": 80, "temperature": 0, "ignore_eos": True})
    req = Request(rid="long", input_ids=PROMPT, params=params, sink=sink, stream=True)
    core_b.submit([req])
    await asyncio.wait_for(started.wait(), 30)
    await core_b.load_weights_from_dir(tiny_model_b, "waited")
    assert done.is_set() and len(req.output_ids) == 80
    assert versions == [versions[0]] and versions[0] != "waited"
    assert core_b.weight_version == "waited"


def test_tied_embeddings_update_consistently(tmp_path: Path) -> None:
    from tests.engine.conftest import build_tiny_qwen3

    path = build_tiny_qwen3(tmp_path / "tied", seed=2, tied=True)
    engine = Engine(path, EngineConfig())
    try:
        emb = engine.model.get_input_embeddings().weight
        new = torch.randn_like(emb)
        with pytest.raises(WeightUpdateError, match="tied"):
            asyncio.run(
                engine.update_weights([("model.embed_tokens.weight", new), ("lm_head.weight", -new)], "x")
            )
        assert not torch.equal(emb, new)
        # The checkpoint form of a tied model names only the embedding: the head follows it.
        asyncio.run(engine.update_weights([("model.embed_tokens.weight", new)], "y"))
        assert torch.equal(engine.model.get_output_embeddings().weight, new)
        asyncio.run(
            engine.update_weights([("model.embed_tokens.weight", emb * 0), ("lm_head.weight", emb * 0)], "z")
        )
        assert engine.weight_version == "z" and not engine.model.get_output_embeddings().weight.any()
    finally:
        engine.shutdown()


def test_an_moe_checkpoints_per_expert_names_update_the_fused_experts(tmp_path: Path) -> None:
    """Qwen3-MoE is saved and published one tensor per expert; transformers fuses them in memory
    (gate_up_proj[E], down_proj[E]). An update under the checkpoint's names makes the engine serve
    exactly what an engine loaded from that checkpoint serves."""
    from tests.trainer.support import tiny_qwen3_moe

    prompt = [10, 200, 3000, 77, 5, 1024]  # ids of its 4096-row vocabulary
    a, b = tiny_qwen3_moe(tmp_path / "a", seed=0), tiny_qwen3_moe(tmp_path / "b", seed=1)
    engine, ref = Engine(a, EngineConfig()), Engine(b, EngineConfig())
    try:
        want = asyncio.run(run_core(ref, prompt))
        before = asyncio.run(run_core(engine, prompt))
        assert before.output_logprobs != want.output_logprobs
        named = read_safetensors_dir(b)
        assert "model.layers.0.mlp.experts.3.up_proj.weight" in named  # the per-expert form
        gate = named["model.layers.0.mlp.experts.3.gate_proj.weight"]
        with pytest.raises(WeightUpdateError, match=r"experts\.4\.gate_proj"):  # there is no expert 4
            asyncio.run(engine.update_weights([("model.layers.0.mlp.experts.4.gate_proj.weight", gate)], "x"))
        asyncio.run(engine.update_weights(named.items(), "b"))
        after = asyncio.run(run_core(engine, prompt))
        assert after.output_ids == want.output_ids and after.output_logprobs == want.output_logprobs
        fused = engine.model.state_dict()["model.layers.1.mlp.experts.gate_up_proj"]
        assert torch.equal(fused[2, 32:], named["model.layers.1.mlp.experts.2.up_proj.weight"])
    finally:
        engine.shutdown()
        ref.shutdown()
