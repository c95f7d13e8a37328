"""The quickstart on first use (issue 13): `examples/quickstart.py`, which the README and the docs show, needs
only the "Run it" install, and on a store that already holds samples it shows the sample it just recorded; the
architecture document exists."""

from __future__ import annotations

import ast
import asyncio
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from rlgw.gateway.trajectories.store import TrajectoryStore
from tests.support.procs import FIXTURES, REPO, free_port, rlgw_process
from tests.support.sample_factory import make_sample


def _quickstart() -> str:
    return (REPO / "examples" / "quickstart.py").read_text()


def _base_requirements() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {re.split(r"[<>=!~\[; ]", dep, maxsplit=1)[0].lower() for dep in project["dependencies"]}


def test_quickstart_imports_come_with_the_base_install() -> None:
    modules = set()
    for node in ast.walk(ast.parse(_quickstart())):
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            modules.add(node.module.split(".")[0])
    third_party = modules - set(sys.stdlib_module_names) - {"rlgw"}
    assert third_party == {"openai"}
    dists = importlib.metadata.packages_distributions()
    base = _base_requirements()
    for module in third_party:
        assert any(d.lower() in base for d in dists[module]), f"{module} is not a base dependency"


def test_the_architecture_document_the_code_cites_exists() -> None:
    doc = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    for heading in ("What each folder owns", "Data flow of one turn", "hand-off contract", "Weight versions"):
        assert heading in doc
    for folder in ("gateway", "engine", "scaffolds", "sandboxes", "trainer", "sync", "bin"):
        assert f"| `{folder}/` |" in doc and (REPO / folder).is_dir()
    sources = [
        p
        for p in REPO.glob("*/**/*.py")
        if p.parts[len(REPO.parts)] not in (".venv", "rlgw", "build") and p != Path(__file__)
    ]
    citing = [p for p in sources if "DESIGN.md" in p.read_text(errors="replace")]
    assert citing == [], "these cite a DESIGN.md the repository does not hold"


@pytest.mark.slow
def test_quickstart_shows_the_sample_it_just_recorded(tmp_path: Path) -> None:
    """Run the quickstart against `rlgw serve` (embedded engine on tiny-chatml, SmolLM2's tokenizer and
    template) on a store that already holds an older sample."""

    async def seed() -> int:
        store = TrajectoryStore.open(tmp_path)
        (cursor,) = await store.add_samples(
            "default", "older", "older-task", [make_sample(np.random.default_rng(0))]
        )
        await store.close()
        return cursor

    older = asyncio.run(seed())
    port = free_port()
    args = [
        "serve",
        "--model",
        str(FIXTURES / "tiny-chatml"),
        "--port",
        str(port),
        "--data-dir",
        str(tmp_path),
    ]
    with rlgw_process(args, "/health", port) as url:
        code = _quickstart().replace("http://127.0.0.1:8000", url)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    *_, summary_line, sample_line = out.stdout.strip().splitlines()
    trainable = int(summary_line.split()[0])
    cursor, _length, shown_trainable, *_ = sample_line.split()
    assert int(cursor) > older and int(shown_trainable) == trainable > 0
