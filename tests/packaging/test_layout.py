"""The package is readable by tools: one import root whose subpackages are the top-level folders."""

from __future__ import annotations

import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import rlgw

ROOT = Path(__file__).resolve().parents[2]
SUBPACKAGES = {"bin", "engine", "gateway", "integrations", "sandboxes", "scaffolds", "sync", "trainer"}


def test_pkgutil_lists_every_subpackage() -> None:
    found = {m.name for m in pkgutil.walk_packages(rlgw.__path__, "rlgw.")}
    assert {f"rlgw.{p}" for p in SUBPACKAGES} <= found
    assert {"rlgw.gateway.ledger.ledger", "rlgw.engine.scheduler", "rlgw.sync.delta"} <= found


def test_imports_work_from_a_checkout_without_installing(tmp_path: Path) -> None:
    # A copy of the checkout (symlinks kept) on PYTHONPATH: it is found before the installed package.
    for name in ("rlgw", *SUBPACKAGES):
        shutil.copytree(
            ROOT / name, tmp_path / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
        )
    code = "import rlgw.gateway.ledger.ledger as m, rlgw.engine.scheduler; print(m.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd="/",
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == tmp_path / "rlgw" / "gateway" / "ledger" / "ledger.py"


def test_a_static_analyser_resolves_a_class_to_its_file() -> None:
    jedi = pytest.importorskip("jedi")
    script = jedi.Script(
        "from rlgw.gateway.ledger.ledger import Ledger\nLedger",
        path=str(ROOT / "probe.py"),
        project=jedi.Project(str(ROOT)),
    )
    [definition] = script.goto(2, 1, follow_imports=True)
    assert Path(definition.module_path).resolve() == (ROOT / "gateway" / "ledger" / "ledger.py").resolve()
    assert definition.name == "Ledger" and definition.type == "class"
