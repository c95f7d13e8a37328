"""Where the embedded engine's prefix cache lands for a user (issue 29 part 4): three user paths timed with
the cache off (`--cache-mib 0`, the same code otherwise) and on (the default, 1024 MiB), in one session.

- `quickstart`: `rlgw serve` on the embedded engine (SmolLM2-135M, the default model; its GGUF conversion is
  warmed first and not timed), then the quickstart (`examples/quickstart.py`) run as a user runs it
  (its own Python process, the real `openai` client). Start-up (process start to `/health`) and the agent
  (the quickstart process, interpreter start included) are reported apart.
- `clis`: the coding-agent CLIs' real runs of `tests/scaffolds/test_real_clis.py`, in its order (Claude Code,
  Codex, opencode, qwen-code, pi on Chat / Messages / Responses, Claude Code with a subagent) with the test's
  task, settings and product path (`InstalledAgent` with the CLI's scaffold on a local sandbox), against
  `rlgw serve` in front of `rlgw engine` on `tests/fixtures/tiny-agent`; one fresh engine per (repeat,
  variant) serves all of them, as the test module's one stack does. The test's recording proxy (there only for
  its token-exact checks) is left out: the gateway talks to the engine directly, as a user's does.
- `train`: `rlgw train` on `trainer/configs/word-tiny.json` (12 iterations), `cache_mib: 0` vs the config's
  default; the whole command's wall time and its receipts' rollout / train / sync seconds.

Runs alternate off, on, off, on ... (`--repeats` pairs); each run is printed as it ends with the 1-minute
load average at its start (other work shares the machine), then a table of medians and the ratio off/on
per figure (> 1: the cache made it faster). "X: engine" is the part of X the gateway's turns spent waiting on
the engine (`rlgw_engine_seconds_sum` of its `/metrics`): where the cache can act; the rest is the agent's own
work, the gateway and start-up. "cache hits": the engine's prefix-cache hits / lookups (`/server_info`) after
the run. Nothing here asserts a time.

    python -m bench.user_paths [--repeats 2] [--paths quickstart,clis,train] [--clis claude-code,codex,...]

The CLIs install into ~/.cache/rlgw/agents/ on first use (minutes): the first `clis` run installs them
before any timing, as does `python -m pytest -m real_agent tests/scaffolds/test_real_clis.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlgw.engine.models import resolve_model  # noqa: E402
from rlgw.gateway.trajectories.client import GatewayClient  # noqa: E402
from rlgw.scaffolds.agent import AgentConfig, InstalledAgent  # noqa: E402
from rlgw.scaffolds.claude_code import ClaudeCodeScaffold  # noqa: E402
from rlgw.scaffolds.codex import CodexScaffold  # noqa: E402
from rlgw.scaffolds.node_cli import NodeCliScaffold  # noqa: E402
from rlgw.scaffolds.opencode import OpencodeScaffold  # noqa: E402
from rlgw.scaffolds.pi import PiScaffold  # noqa: E402
from rlgw.scaffolds.qwen_code import QwenCodeScaffold  # noqa: E402
from rlgw.scaffolds.tasks import Task, Verifier  # noqa: E402
from tests.fixtures.build_agent_fixture import SETUP_FILES, TASKS  # noqa: E402
from tests.scaffolds.test_real_clis import VERIFY  # noqa: E402
from tests.support.agent_venvs import cache_root  # noqa: E402
from tests.support.procs import FIXTURES, engine_server, free_port, rlgw_process  # noqa: E402
from tests.support.real_runs import Sandboxes  # noqa: E402
from tests.test_readme_quickstart import _quickstart  # noqa: E402

# The flags each variant adds to the engine's command line: "off" is the only difference.
VARIANTS: dict[str, list[str]] = {"off": ["--cache-mib", "0"], "on": []}
AGENT_MODEL = FIXTURES / "tiny-agent"
TRAIN_CONFIG = REPO / "trainer" / "configs" / "word-tiny.json"


def _pi(api: str) -> Callable[[str], NodeCliScaffold]:
    return lambda prefix: PiScaffold(prefix=prefix, api=api)  # type: ignore[arg-type]


# test_real_clis.py's runs, in its order: (run name, the scaffold's class, how to build it on a prefix).
CLI_RUNS: dict[str, tuple[str, type[NodeCliScaffold], Callable[[str], NodeCliScaffold]]] = {
    "claude-code": ("claude-code", ClaudeCodeScaffold, lambda p: ClaudeCodeScaffold(prefix=p)),
    "codex": ("codex", CodexScaffold, lambda p: CodexScaffold(prefix=p)),
    "opencode": ("opencode", OpencodeScaffold, lambda p: OpencodeScaffold(prefix=p)),
    "qwen-code": ("qwen-code", QwenCodeScaffold, lambda p: QwenCodeScaffold(prefix=p)),
    "pi-chat": ("pi", PiScaffold, _pi("openai-completions")),
    "pi-messages": ("pi", PiScaffold, _pi("anthropic-messages")),
    "pi-responses": ("pi", PiScaffold, _pi("openai-responses")),
    "claude-code-agent": ("claude-code-agent", ClaudeCodeScaffold, lambda p: ClaudeCodeScaffold(prefix=p)),
}


@dataclass
class Run:
    """One timed run of one path: its figures (seconds, unless the name gives a unit), and its notes."""

    path: str
    variant: str
    repeat: int
    load: float
    figures: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        figures = "  ".join(f"{k} {v:.1f}{'' if '/' in k else 's'}" for k, v in self.figures.items())
        head = f"{self.path:<10} {self.variant:<3} #{self.repeat}  load {self.load:5.1f}"
        return f"{head}  {figures}  {' '.join(self.notes)}"


def schedule(repeats: int) -> Iterator[tuple[int, str]]:
    """(repeat, variant) in ABAB order."""
    for i in range(repeats):
        for variant in VARIANTS:
            yield i, variant


def cache_counts(engine_url: str) -> str:
    """The engine's prefix-cache lookups and hits since it started."""
    stats = httpx.get(engine_url + "/server_info", timeout=30).json()["prefix_cache"]
    return f"cache hits {stats['hits']}/{stats['lookups']}"


def engine_wait(gateway: str) -> float:
    """Seconds the gateway's turns have spent waiting on the engine (`rlgw_engine_seconds_sum`)."""
    for line in httpx.get(gateway + "/metrics", timeout=30).text.splitlines():
        if line.startswith("rlgw_engine_seconds_sum "):
            return float(line.split()[1])
    return 0.0


@contextmanager
def timed(run: Run, name: str) -> Iterator[None]:
    """Add the block's wall time to `run.figures[name]`."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        run.figures[name] = run.figures.get(name, 0.0) + time.perf_counter() - t0


def quickstart(run: Run, tmp: Path) -> None:
    """`rlgw serve` (embedded SmolLM2), then the quickstart in its own process."""
    port, engine_port = free_port(), free_port()
    args = ["serve", "--port", str(port), "--engine-port", str(engine_port), "--data-dir", str(tmp),
            *VARIANTS[run.variant]]  # fmt: skip
    t0 = time.perf_counter()
    with rlgw_process(args, "/health", port) as url:
        run.figures["start-up"] = time.perf_counter() - t0
        code = _quickstart().replace("http://127.0.0.1:8000", url)
        with timed(run, "agent"):
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
        run.figures["agent: engine"] = engine_wait(url)
        run.notes.append(cache_counts(f"http://127.0.0.1:{engine_port}"))
    if out.returncode != 0:
        raise RuntimeError(f"the quickstart failed:\n{out.stderr[-3000:]}")
    # "N trainable tokens in 1 sample(s)": sampled at temperature 0.7, so its length varies run to run.
    tokens = int(out.stdout.strip().splitlines()[-2].split()[0])
    run.figures["agent ms/token"] = 1000 * run.figures["agent"] / tokens
    run.notes.append(f"{tokens} tokens sampled")


async def cli(run: Run, tmp: Path, gateway: str, name: str) -> None:
    """One of test_real_clis.py's runs, with its task and settings, through `InstalledAgent`."""
    run_name, cls, build = CLI_RUNS[name]
    scaffold = build(str(cache_root() / f"npm-{cls.name}-{cls.default_version}"))
    files = {"README.md": "notes\n", **SETUP_FILES.get(run_name, {})}
    task = Task(
        f"{run_name}-hello", TASKS[run_name], setup_files=files, verifier=Verifier(VERIFY, timeout_s=60)
    )
    config = AgentConfig(mode="capture", model="tiny-agent", max_turns=4, agent_timeout_s=900,
                         install_timeout_s=1800, sampling={"temperature": 0.0},
                         artifacts_dir=tmp / "artifacts")  # fmt: skip
    waited = engine_wait(gateway)
    async with GatewayClient(gateway) as client:
        r = await InstalledAgent(scaffold, Sandboxes(tmp / "sandboxes"), client, config).run(task)
    run.figures[name] = r.duration_s
    run.figures[f"{name}: engine"] = engine_wait(gateway) - waited
    if r.reward != 1.0 or r.failed_stage is not None:
        run.notes.append(f"{name}: {r.termination} reward={r.reward} {r.failed_stage or ''} {r.error or ''}")


def clis(run: Run, tmp: Path, names: list[str]) -> None:
    """A fresh `rlgw engine` on tiny-agent, `rlgw serve` in front of it, and the CLIs' runs one by one."""
    t0 = time.perf_counter()
    with engine_server(AGENT_MODEL, *VARIANTS[run.variant]) as engine:
        port = free_port()
        with rlgw_process(["serve", "--engine-url", engine, "--port", str(port), "--data-dir", str(tmp)],
                          "/health", port) as gateway:  # fmt: skip
            run.figures["start-up"] = time.perf_counter() - t0
            with timed(run, "all runs"):
                for name in names:
                    asyncio.run(cli(run, tmp / name, gateway, name))
            run.figures["all runs: engine"] = engine_wait(gateway)
            run.notes.append(cache_counts(engine))


def train(run: Run, tmp: Path) -> None:
    """`rlgw train` on word-tiny (the cache off: `cache_mib: 0`); wall time and the receipts' split."""
    doc = json.loads(TRAIN_CONFIG.read_text())
    doc["model"] = str(REPO / doc["model"])
    if run.variant == "off":
        doc["cache_mib"] = 0
    config = tmp / "config.json"
    config.write_text(json.dumps(doc))
    cmd = [sys.executable, "-m", "rlgw.bin.main", "train", "--config", str(config),
           "--work-dir", str(tmp / "work"), "--no-progress"]  # fmt: skip
    with timed(run, "wall"):
        out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    if out.returncode != 0:
        raise RuntimeError(f"rlgw train failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    receipts = [json.loads(line) for line in (tmp / "work" / "receipts.jsonl").read_text().splitlines()]
    for part in ("rollout", "train", "sync"):
        run.figures[part] = sum(r["seconds"][part] for r in receipts)
    run.figures["outside loop"] = run.figures["wall"] - sum(r["seconds"]["total"] for r in receipts)
    run.notes.append(f"iterations {len(receipts)} final reward {receipts[-1]['reward_mean']:.3f}")


def report(runs: list[Run]) -> None:
    """Per path and figure: the median of each variant and the ratio off/on."""
    print("\n| path | figure (s) | off median | on median | off/on | runs (off; on) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for path in dict.fromkeys(r.path for r in runs):
        mine = [r for r in runs if r.path == path]
        for figure in dict.fromkeys(k for r in mine for k in r.figures):
            by = {
                v: [r.figures[figure] for r in mine if r.variant == v and figure in r.figures]
                for v in VARIANTS
            }
            if not all(by.values()):
                continue
            off, on = statistics.median(by["off"]), statistics.median(by["on"])
            each = "; ".join(" ".join(f"{x:.1f}" for x in by[v]) for v in VARIANTS)
            ratio = f"{off / on:.2f}" if on > 0 else "-"
            print(f"| {path} | {figure} | {off:.1f} | {on:.1f} | {ratio} | {each} |")


def main() -> int:
    """Run the chosen paths, ABAB, and print each run and the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2, help="off/on pairs per path (default 2)")
    ap.add_argument("--paths", default="quickstart,clis,train", help="comma-separated: quickstart,clis,train")
    ap.add_argument("--clis", default=",".join(CLI_RUNS), help=f"comma-separated, of: {','.join(CLI_RUNS)}")
    args = ap.parse_args()
    paths = args.paths.split(",")
    names = args.clis.split(",")
    if "quickstart" in paths:
        resolve_model("smollm2")  # the one-time GGUF conversion, before any timing
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="rlgw-user-paths-") as root:
        if "clis" in paths:  # the CLIs' first install (minutes) happens here, untimed
            warm = Run("clis", "on", -1, os.getloadavg()[0])
            clis(warm, Path(root) / "install", names)
            print(f"(untimed install/warm-up run: {warm.line()})", flush=True)
        for path in paths:
            step = {"quickstart": quickstart, "train": train}.get(path)
            for i, variant in schedule(args.repeats):
                run = Run(path, variant, i, os.getloadavg()[0])
                tmp = Path(root) / f"{path}-{variant}-{i}"
                tmp.mkdir()
                if step is not None:
                    step(run, tmp)
                else:
                    clis(run, tmp, names)
                runs.append(run)
                print(run.line(), flush=True)
    report(runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
