"""Every sync path against the real embedded engine (one subprocess for the module, tiny Qwen3).

The tests run in file order and walk the engine through versions: full disk v1, xor delta v2, the
refusals (corrupt, truncated, wrong base, out of order, repeated), a crash before the swap, an
overwrite delta, then a gloo broadcast and a shared-memory hand-off. After each success the engine's
input logprobs must equal those of a model loaded directly from the new weights; after each refusal
its version and live-weight digest must be bit-identical to before.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rlgw.sync import checkpoint as ck
from rlgw.sync.client import SyncClient
from rlgw.sync.colocated import ShmSender
from rlgw.sync.delta import DELTA_FILE
from rlgw.sync.errors import FleetMismatch, WeightSyncError
from rlgw.sync.fleet import check_fleet
from rlgw.sync.publisher import WeightPublisher
from tests.support.procs import FIXTURES, engine_server, free_port

IDS = [4000, 17, 250, 1033, 9, 77, 3021, 512, 64, 2047, 11, 300]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    """The engine plus the trainer's side: publish root, local dir, current reference state."""
    src = FIXTURES / "tiny-qwen3"
    if not (src / "model.safetensors").is_file():
        pytest.skip("tests/fixtures/tiny-qwen3 is not built")
    tmp = tmp_path_factory.mktemp("sync")
    torch.manual_seed(0)
    state = load_file(str(src / "model.safetensors"))
    with engine_server(src) as url:
        yield {
            "url": url,
            "tmp": tmp,
            "root": tmp / "published",
            "local": tmp / "local",
            "state": state,
            "aux": src,
            "client": SyncClient([url]),
        }


def perturb(state: dict[str, torch.Tensor], seed: int, frac: float = 0.01) -> dict[str, torch.Tensor]:
    """A new policy: `frac` of every tensor's elements moved (an optimizer step, exaggerated)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in state.items():
        t = t.clone()
        flat = t.view(-1)
        idx = torch.randperm(flat.numel(), generator=g)[: max(1, int(flat.numel() * frac))]
        flat[idx] += torch.randn(idx.numel(), generator=g) * 0.5
        out[name] = t
    return out


def engine_logprobs(url: str) -> torch.Tensor:
    body = {
        "input_ids": IDS,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0},
        "return_logprob": True,
        "logprob_start_len": 0,
    }
    doc = httpx.post(f"{url}/generate", json=body, timeout=60).json()
    return torch.tensor([lp for lp, _, _ in doc["meta_info"]["input_token_logprobs"][1:]])


def reference_logprobs(model_dir: Path, state: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """Logprobs of IDS from a model loaded from `model_dir` (optionally with `state` loaded on top)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if state is not None:
        model.load_state_dict(state, strict=False)
    with torch.no_grad():
        logits = model(torch.tensor([IDS])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(IDS[1:])[:, None])[:, 0]


def snapshot(url: str) -> tuple[str, str]:
    doc = httpx.get(f"{url}/weight_checkpoint", timeout=60).json()
    return doc["weight_version"], doc["live_digest"]


def pull(world: dict, version: int, root: Path | None = None) -> httpx.Response:
    body = {
        "source_dir": str(root or world["root"]),
        "target_version": version,
        "local_checkpoint_dir": str(world["local"]),
        "durable": False,
    }
    return httpx.post(f"{world['url']}/pull_weights", json=body, timeout=120)


def assert_serves(world: dict, version: int, model_dir: Path, state: dict | None = None) -> None:
    got, want = engine_logprobs(world["url"]), reference_logprobs(model_dir, state)
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    assert snapshot(world["url"])[0] == str(version)


def assert_refused(world: dict, response: httpx.Response, before: tuple[str, str], match: str) -> None:
    assert response.status_code == 400, response.text
    assert response.json()["success"] is False and match in response.json()["message"], response.json()
    assert snapshot(world["url"]) == before  # same version, bit-identical live weights


def test_full_disk_then_xor_delta(world: dict) -> None:
    pub = world["pub"] = WeightPublisher(world["root"], encoding="xor", aux_src=world["aux"], durable=False)
    pub.publish(world["state"].items(), 1, kind="full")
    asyncio.run(world["client"].pull(world["root"], 1, world["local"], durable=False))
    old = reference_logprobs(world["local"] / "weight_v000001")
    assert_serves(world, 1, world["local"] / "weight_v000001")

    world["state"] = perturb(world["state"], 2)
    index = pub.publish(world["state"].items(), 2)
    assert index.kind == "delta" and (world["root"] / "weight_v000002" / DELTA_FILE).stat().st_size < 200_000
    r = pull(world, 2)
    assert r.status_code == 200 and r.json()["chain"] == [2], r.text
    new_dir = world["local"] / "weight_v000002"
    assert_serves(world, 2, new_dir)
    assert (reference_logprobs(new_dir) - old).abs().max() > 1e-3  # the new weights really differ
    check_fleet(asyncio.run(world["client"].status()), "2", index.checkpoint_digest)


def test_repeated_apply_is_a_no_op(world: dict) -> None:
    before = snapshot(world["url"])
    files = {p.name: ck.digest(p.read_bytes()) for p in (world["local"] / "weight_v000002").iterdir()}
    r = pull(world, 2)
    assert r.status_code == 200 and "nothing applied" in r.json()["message"]
    assert snapshot(world["url"]) == before
    assert {p.name: ck.digest(p.read_bytes()) for p in (world["local"] / "weight_v000002").iterdir()} == files


def _publish_next(world: dict, version: int) -> Path:
    world["next_state"] = perturb(world["state"], version)
    world["pub"].publish(world["next_state"].items(), version)
    return world["root"] / ck.version_dirname(version)


def test_corrupted_and_truncated_deltas_are_refused(world: dict) -> None:
    vdir = _publish_next(world, 3)
    pristine = (vdir / DELTA_FILE).read_bytes()
    before = snapshot(world["url"])
    corrupt = bytearray(pristine)
    corrupt[len(corrupt) // 2] ^= 0x40
    (vdir / DELTA_FILE).write_bytes(bytes(corrupt))
    assert_refused(world, pull(world, 3), before, "v3")
    (vdir / DELTA_FILE).write_bytes(pristine[: len(pristine) - 100])
    assert_refused(world, pull(world, 3), before, "truncated")
    assert not list(world["local"].glob(".tmp-*")), "a refused pull left staging behind"
    (vdir / DELTA_FILE).write_bytes(pristine)


def test_wrong_base_and_out_of_order_are_refused(world: dict) -> None:
    before = snapshot(world["url"])
    # Another trainer's v1 (different bytes) with a delta v2 on top: wrong base for our local v2 chain.
    other = world["tmp"] / "other"
    pub = WeightPublisher(other, aux_src=world["aux"], durable=False)
    pub.publish(perturb(world["state"], 99).items(), 1, kind="full")
    pub.publish(perturb(world["state"], 98).items(), 2)
    pub.publish(perturb(world["state"], 97).items(), 3)
    assert_refused(world, pull(world, 3, other), before, "wrong base")
    # Our v4 rewritten to claim base v2: out of order after v3.
    vdir = _publish_next_keep(world, 4)
    index = orjson.loads((vdir / ck.INDEX_NAME).read_bytes())
    index["metadata"]["base_version"] = 2
    (vdir / ck.INDEX_NAME).write_bytes(orjson.dumps(index))
    assert_refused(world, pull(world, 4), before, "out-of-order")


def _publish_next_keep(world: dict, version: int) -> Path:
    """Publish `version` on top of v3's state (kept as the trainer's current one)."""
    world["state"] = world["next_state"]
    return _publish_next(world, version)


def test_crash_between_stage_and_swap_then_retry(world: dict) -> None:
    # v3 is intact; a separate process pulls it and dies right before the rename.
    code = (
        "import os, sys\nfrom pathlib import Path\nimport rlgw.sync.pull as p\n"
        "p._before_swap = lambda staged: os._exit(17)\n"
        "p.pull(Path(sys.argv[1]), 3, Path(sys.argv[2]), durable=False)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(world["root"]), str(world["local"])], timeout=120)
    assert proc.returncode == 17
    assert list(world["local"].glob(".tmp-weight_v000003-*")), "the crash should leave a staged dir"
    assert not (world["local"] / "weight_v000003").exists()
    before = snapshot(world["url"])
    r = pull(world, 3)
    assert r.status_code == 200, r.text
    assert snapshot(world["url"]) != before
    assert not list(world["local"].glob(".tmp-*"))
    assert_serves(world, 3, world["local"] / "weight_v000003")


def test_overwrite_delta(world: dict) -> None:
    root = world["tmp"] / "published-overwrite"
    pub = WeightPublisher(root, encoding="overwrite", aux_src=world["aux"], durable=False)
    pub.seed(world["local"] / "weight_v000003")
    state = perturb(world["state"], 5)
    index = pub.publish(state.items(), 4)
    assert {r.encoding for r in index.tensors.values()} == {"overwrite"}
    shutil.copytree(world["local"] / "weight_v000003", root / "weight_v000003")  # its base, as a full
    r = pull(world, 4, root)
    assert r.status_code == 200 and r.json()["chain"] == [4], r.text
    assert_serves(world, 4, world["local"] / "weight_v000004")
    world["state"] = state


def test_distributed_broadcast_over_gloo(world: dict) -> None:
    state = perturb(world["state"], 6)
    asyncio.run(world["client"].broadcast(state.items(), 6, master_port=free_port(), bucket_bytes=64 << 10))
    assert_serves(world, 6, world["aux"], state)
    world["state"] = state


def test_broadcast_with_a_wrong_shape_changes_nothing(world: dict) -> None:
    before = snapshot(world["url"])
    bad = dict(world["state"])
    name = next(iter(bad))
    bad[name] = torch.zeros(3, 3)
    with pytest.raises(WeightSyncError, match="shape"):
        asyncio.run(world["client"].broadcast(bad.items(), 7, master_port=free_port(), bucket_bytes=64 << 10))
    assert snapshot(world["url"]) == before


def test_colocated_shared_memory_handoff(world: dict) -> None:
    state = perturb(world["state"], 8)
    sender = ShmSender()
    try:
        asyncio.run(world["client"].handoff(state.items(), 8, sender))
    finally:
        sender.close()
    assert_serves(world, 8, world["aux"], state)
    with pytest.raises(FleetMismatch, match="expected '7'"):
        check_fleet(asyncio.run(world["client"].status()), "7")


def test_pickled_tensors_are_refused(world: dict) -> None:
    body = {"serialized_named_tensors": ["gASVAAAAAAAAAAA="], "load_format": None}
    r = httpx.post(f"{world['url']}/update_weights_from_tensor", json=body, timeout=30)
    assert r.status_code == 400 and "never unpickles" in r.json()["message"]


def test_cli_status_is_an_error_on_mismatch(world: dict, capsys: pytest.CaptureFixture[str]) -> None:
    from rlgw.bin.main import main

    assert main(["sync", "status", "--engine", world["url"], "--expect-version", "8"]) == 0
    assert main(["sync", "status", "--engine", world["url"], "--expect-version", "7"]) == 1
    out = capsys.readouterr().out
    assert world["url"] in out and "MISMATCH" in out and "expected '7'" in out
