"""Make a lock: `python -m rlgw.scaffolds.locks openhands==1.16.0 --import openhands_cli.entrypoint`.

Builds a throwaway venv with the agent's Python, lets pip resolve the release from the
configured index, imports the given modules, and writes the venv's `pip freeze --all` (pip
left out: the venv brings its own) to `<distribution>-<version>.txt` here.
Run the agent's real-run test on the new lock before committing it.
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import tempfile
from pathlib import Path

from rlgw.scaffolds.locks import LOCKS_DIR, PIN


def make_lock(requirement: str, python: str, imports: list[str]) -> Path:
    """Resolve `requirement` in a new venv of `python`, import `imports`, write its freeze to a lock file."""
    m = PIN.match(requirement)
    if m is None:
        raise SystemExit(f"give the release as NAME==VERSION, not {requirement!r}")
    with tempfile.TemporaryDirectory(prefix="rlgw-lock-") as tmp:
        py = str(Path(tmp) / "bin" / "python")
        subprocess.run([python, "-m", "venv", tmp], check=True)
        subprocess.run(
            [py, "-m", "pip", "install", "-q", "--disable-pip-version-check", requirement], check=True
        )
        for module in imports:
            subprocess.run([py, "-c", f"import {module}"], check=True)
        freeze = subprocess.run(
            [py, "-m", "pip", "freeze", "--all"], check=True, capture_output=True, text=True
        )
        version = subprocess.run([py, "-c", "import sys; print(sys.version.split()[0])"], check=True,
                                 capture_output=True, text=True).stdout.strip()  # fmt: skip
    pins = [line for line in freeze.stdout.splitlines() if not line.startswith("pip==")]
    day = datetime.date.today().isoformat()
    header = (
        f"# {requirement} for Python {version[:4]}: `pip freeze` of a venv where pip resolved it on {day}\n"
        f"# (checked: {', '.join(imports) or 'nothing'} imported). "
        "Installed with `pip install --no-deps -r`.\n"
    )
    out = LOCKS_DIR / f"{m[1]}-{m[2]}.txt"
    out.write_text(header + "\n".join(pins) + "\n")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("requirement", help="the agent release, NAME==VERSION")
    p.add_argument("--python", default="python3.12", help="the interpreter the agent's venv uses")
    p.add_argument("--import", dest="imports", action="append", default=[], help="a module that must import")
    args = p.parse_args()
    print(make_lock(args.requirement, args.python, args.imports), file=sys.stderr)


if __name__ == "__main__":
    main()
