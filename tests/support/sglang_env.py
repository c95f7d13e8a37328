"""The real SGLang for tests: its virtual environment, built from the package registries once, and the server.

SGLang lives in its own venv, `~/.cache/rlgw/sglang/sglang-<version>` (`RLGW_SGLANG_CACHE` overrides
the root), built by `python -m tests.support.sglang_env` (CI runs it before the tests) under a file
lock and marked ready only after an import check passed; a test that needs it skips, naming that
command, when it is not built. The install is the lean CPU one of the reference
(/work/shared/reference/SGLANG_CPU.md):

1. `torch==2.13.0`, the CPU build the project pins (the sglang wheel's metadata pins torch 2.14.1, a
   CUDA build: its dependencies are never resolved by pip);
2. `sglang`, `torchvision` and `triton` without their dependencies (torchvision's would pull a CUDA
   torch; triton is imported unconditionally even on CPU);
3. the CPU path's dependencies, which pip resolves (none of them pulls another torch);
4. two things PyPI lacks: a `.pth` hook that defines torchvision's `nms`/`qnms` op schemas before
   torchvision is imported (PyPI's torchvision is a CUDA build whose `_C.so` does not load beside a
   CPU torch, and its meta registrations die without the schemas; SGLang never calls those ops), and
   rlgw's stand-in for the sgl-kernel CPU ops (tests/support/sgl_kernel_standin), put on the server's
   `PYTHONPATH` at launch so that the stand-in in this tree is the one that runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from rlgw.sync.sglang_reload import load_into_engine
from tests.support.agent_venvs import READY, find_python
from tests.support.e2e import Stack
from tests.support.procs import free_port, rlgw_process, wait_healthy
from tests.support.recording_proxy import recording_proxy

SGLANG_VERSION = "0.5.23"
BUILD_COMMAND = "python -m tests.support.sglang_env"
STANDIN = Path(__file__).parent / "sgl_kernel_standin"
TORCH = "torch==2.13.0"
NO_DEPS = (f"sglang=={SGLANG_VERSION}", "torchvision==0.28.0", "triton==3.9.0")
CPU_PATH_DEPS = (
    "xgrammar==0.2.7 transformers==5.19.0 tokenizers==0.23.2 openai==2.8.0 apache-tvm-ffi==0.1.11 numpy "
    "orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq tqdm IPython aiohttp "
    "huggingface_hub dill sentencepiece compressed-tensors gguf uvicorn uvloop fastapi partial_json_parser "
    "setproctitle einops jsonschema soundfile python-multipart"
).split()
# Runs at every start of the venv's interpreter (SGLang's processes all import torch anyway): the two
# schemas torchvision's meta registrations look up (`torchvision/_meta_registrations.py`).
NMS_SCHEMA = "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
TORCHVISION_HOOK = (
    f"import torch; torch.library.define('torchvision::nms', '{NMS_SCHEMA}'); "
    f"torch.library.define('torchvision::qnms', '{NMS_SCHEMA}')\n"
)


def venv_dir() -> Path:
    """Where the SGLang venv lives."""
    root = Path(os.environ.get("RLGW_SGLANG_CACHE", Path.home() / ".cache" / "rlgw" / "sglang"))
    return root / f"sglang-{SGLANG_VERSION}"


def sglang_python() -> Path:
    """The interpreter of the ready SGLang venv; skips the test, naming the build command, without one."""
    venv = venv_dir()
    if not (venv / READY).exists():
        pytest.skip(f"{venv} is not built; `{BUILD_COMMAND}` builds it (sglang=={SGLANG_VERSION}, ~1-3 min)")
    return venv / "bin" / "python"


def build() -> Path:
    """Build the SGLang venv unless it is ready (under a file lock: another process may be building it)."""
    venv = venv_dir()
    interpreter = find_python("3.11")
    if interpreter is None:  # sglang 0.5.23 has one wheel, cp311, and no sdist
        raise RuntimeError("the sglang 0.5.23 wheel needs Python 3.11 (on PATH or in pyenv)")
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / READY).exists():
            _build(interpreter, venv)
    return venv


def _build(interpreter: str, venv: Path) -> None:
    shutil.rmtree(venv, ignore_errors=True)  # a half-built one from an interrupted run
    started = time.monotonic()
    subprocess.run([interpreter, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "--disable-pip-version-check", "-q", "install"]
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    for step in (
        [*pip, TORCH],
        [*pip, "--no-deps", *NO_DEPS],
        [*pip, TORCH, *CPU_PATH_DEPS],  # torch named again so that nothing resolves another one
        [python, "-c", "import torch; assert torch.__version__.endswith('+cpu'), torch.__version__"],
    ):
        _run(step, venv)
    Path(site, "rlgw_torchvision_schemas.pth").write_text(TORCHVISION_HOOK)
    _run([python, "-c", "import sglang.srt.entrypoints.http_server"], venv)
    size = subprocess.run(["du", "-sm", str(venv)], capture_output=True, text=True).stdout.split()[0]
    (venv / READY).write_text(
        f"sglang=={SGLANG_VERSION}\ninstalled in {time.monotonic() - started:.0f}s, {size} MB\n"
    )


def _run(step: list[str], venv: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(STANDIN)}
    done = subprocess.run(step, capture_output=True, text=True, timeout=1800, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"building {venv} failed at {step}:\n{done.stderr[-3000:]}")


def server_env() -> dict[str, str]:
    """The environment SGLang's processes run with: the CPU engine, the stand-in on the path, one thread."""
    return {
        **os.environ,
        "SGLANG_USE_CPU_ENGINE": "1",
        # Only the stand-in: the test tree's own packages stay off SGLang's path.
        "PYTHONPATH": str(STANDIN),
        # One OpenMP thread unless told otherwise: on the loaded 2-core machine two threads spin at
        # every barrier waiting for each other (docs/ENGINES.md measures the same for vLLM).
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "PYTHONUNBUFFERED": "1",
    }


@contextlib.contextmanager
def sglang_server(model: Path, *extra: str, log: Path | None = None) -> Iterator[str]:
    """`model` served by the real SGLang on a free loopback port (float32, an 8192-token KV pool);
    yields its base URL. Start-up takes 17-50 s on the loaded 2-core machine.

    Without `--max-total-tokens` the KV pool is sized from free memory (15 GB); without
    `--dtype float32` a float32 checkpoint is served as float16.
    """
    with sglang_servers(model, [log], *extra) as (url,):
        yield url


@contextlib.contextmanager
def sglang_servers(model: Path, logs: list[Path | None], *extra: str) -> Iterator[list[str]]:
    """One SGLang server on `model` per entry of `logs` (each logging there), started side by side: the
    workers of a scale-out test pay one start-up, not one each. Yields their base URLs."""
    ports = [free_port() for _ in logs]
    procs = [launch_sglang(model, port, *extra, log=log) for port, log in zip(ports, logs, strict=True)]
    try:
        for proc, port, log in zip(procs, ports, logs, strict=True):
            await_sglang(proc, port, log)
        yield [f"http://127.0.0.1:{port}" for port in ports]
    finally:
        for proc in procs:
            stop_sglang(proc)


def start_sglang(model: Path, port: int, *extra: str, log: Path | None = None) -> subprocess.Popen:
    """Start SGLang on `model` at `port` (its own process group) and wait for its `/health`; see
    `sglang_server`. The caller stops it with `stop_sglang`."""
    proc = launch_sglang(model, port, *extra, log=log)
    await_sglang(proc, port, log)
    return proc


def launch_sglang(model: Path, port: int, *extra: str, log: Path | None = None) -> subprocess.Popen:
    """SGLang on `model` at `port`, started in its own process group; not yet waited for."""
    python = sglang_python()
    cmd = [
        str(python), "-m", "sglang.launch_server", "--model-path", str(model), "--device", "cpu",
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-total-tokens", "8192",
        # `--sleep-on-idle`: an idle scheduler otherwise busy-polls a whole core (1.01 cores measured over 10
        # idle seconds; 0.02 with it), which starves every other process of the 2-core run.
        "--skip-server-warmup", "--sleep-on-idle", *extra,
    ]  # fmt: skip
    out = open(log, "a") if log else subprocess.DEVNULL
    with out if log else contextlib.nullcontext():
        return subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=server_env(), start_new_session=True
        )


def await_sglang(proc: subprocess.Popen, port: int, log: Path | None) -> None:
    """Wait for a launched SGLang's `/health`; stop it and raise with its log's tail if it never comes up."""
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, timeout=300)
    except (RuntimeError, TimeoutError) as exc:
        stop_sglang(proc)
        tail = log.read_text()[-4000:] if log else ""
        raise RuntimeError(f"SGLang did not start: {exc}\n{tail}") from exc


def stop_sglang(proc: subprocess.Popen) -> None:
    """Stop SGLang and its children (the scheduler and detokenizer), whatever state it is in."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 15)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait()


def restore_weights(url: str, model: Path) -> None:
    """Load the checkpoint at `model` back into the SGLang at `url` under its start-up version name
    (`default`): how a test that synced other weights leaves a shared server as it found it."""

    async def load() -> None:
        async with httpx.AsyncClient(timeout=300) as client:
            await load_into_engine(client, url, model, "default")

    asyncio.run(load())


@contextlib.contextmanager
def sglang_stack(
    model: Path, tmp: Path, *gateway_args: str, engine_args: Sequence[str] = ()
) -> Iterator[Stack]:
    """SGLang on `model` (with `engine_args`), the recording proxy in front of it, and `rlgw serve`
    (with `gateway_args`) in front of that."""
    with sglang_server(model, *engine_args, log=tmp / "sglang.log") as engine:
        with recording_proxy(engine) as (proxy, recorder):
            port = free_port()
            # Warnings only: rlgw_process reads the gateway's output only when it exits.
            args = ["--log-level", "warning", "serve", "--engine-url", proxy, "--port", str(port)]
            args += ["--data-dir", str(tmp / "store"), *gateway_args]
            with rlgw_process(args, "/health", port) as gw:
                tok = AutoTokenizer.from_pretrained(model)
                yield Stack(gw, engine, recorder, tok)  # SGLang's teacher forcing: the default


if __name__ == "__main__":
    ready = build()
    sys.stdout.write((ready / READY).read_text())
