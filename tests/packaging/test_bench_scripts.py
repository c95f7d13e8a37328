"""Benchmarks run the way their docstrings say, `python bench/<name>.py`.

Run as a script, a file's folder comes first on `sys.path`, so a bench module named like a
standard-library module (`bench/tokenize.py` once was) is imported in its place by everything
that imports the real one, and the script dies before it starts.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = sorted(p for p in (ROOT / "bench").glob("*.py") if p.name != "__init__.py")


def test_no_bench_module_shadows_the_standard_library() -> None:
    shadowing = [p.name for p in BENCH if p.stem in sys.stdlib_module_names]
    assert not shadowing, f"rename these: run as scripts they replace the standard library's {shadowing}"


def test_a_bench_script_that_imports_bench_modules_runs_as_a_script() -> None:
    # encoders.py imports bench.gateway (the repository root is put on sys.path by the script).
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "encoders.py"), "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout
