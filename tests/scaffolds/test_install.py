"""The install commands run in bash: Python found on PATH or in pyenv, a venv filled by pip, npm skipped.

Offline: the venv installs a wheel built here (pip's own install path, no index), and npm is
only checked for its skip and its missing-runtime message (the real npm installs run in the
`real_agent` tests).
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from rlgw.scaffolds.install import MISSING_RUNTIME, find_python, npm_install, venv_install, venv_marker

SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def bash(
    command: str, *, path: str, home: Path, pyenv_root: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {"PATH": path, "HOME": str(home)}
    if pyenv_root is not None:
        env["PYENV_ROOT"] = str(pyenv_root)
    return subprocess.run(["/bin/bash", "-c", command], capture_output=True, text=True, env=env, timeout=300)


def fake_pyenv(tmp_path: Path, version: str) -> tuple[Path, Path]:
    """A pyenv root whose `version` is this interpreter, and a shim that exits 127 as pyenv's does."""
    root = tmp_path / "pyenv"
    bin_dir = root / "versions" / version / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python3.12").symlink_to(sys.executable)
    shims = root / "shims"
    shims.mkdir()
    shim = shims / "python3.12"
    shim.write_text("#!/bin/sh\necho 'pyenv: python3.12: command not found' >&2\nexit 127\n")
    shim.chmod(0o755)
    return root, shims


def test_python_is_found_in_pyenv_past_a_shim_that_does_not_run(tmp_path: Path) -> None:
    root, shims = fake_pyenv(tmp_path, "3.12.7")
    show = f'{find_python("3.12")}; echo "$py"'
    found = str(root / "versions" / "3.12.7" / "bin" / "python3.12")
    # PYENV_ROOT set; and unset with the sandbox's own HOME: the root comes from the shim's path.
    for pyenv_root in (root, None):
        done = bash(show, path=f"{shims}:{SYSTEM_PATH}", pyenv_root=pyenv_root, home=tmp_path / "home")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == found


def test_no_python_fails_with_a_message_naming_what_to_install(tmp_path: Path) -> None:
    done = bash(f"{find_python('3.97')}; echo reached", path=SYSTEM_PATH, pyenv_root=tmp_path, home=tmp_path)
    assert done.returncode == MISSING_RUNTIME and "reached" not in done.stdout
    assert "needs Python 3.97" in done.stderr and f"pyenv ({tmp_path}/versions)" in done.stderr
    assert "pyenv install 3.97" in done.stderr


def wheel(tmp_path: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel (one module) pip installs without an index."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": "VALUE = 42\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }

    def digest(text: str) -> str:
        raw = hashlib.sha256(text.encode()).digest()
        return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    record = "".join(f"{p},{digest(t)},{len(t.encode())}\n" for p, t in files.items()) + f"{dist}/RECORD,,\n"
    path = tmp_path / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, t in {**files, f"{dist}/RECORD": record}.items():
            z.writestr(p, t)
    return path


def test_venv_install_fills_from_the_lock_once_and_is_skipped_when_marked(tmp_path: Path) -> None:
    root, shims = fake_pyenv(tmp_path, "3.12.7")
    venv = tmp_path / "cache" / "agent-venv"
    lock = tmp_path / "probe.txt"
    lock.write_text(f"# a lock\n{wheel(tmp_path, 'rlgwprobe', '1.2.3')}\n")
    command = venv_install(str(venv), str(lock), "d1", ["rlgwprobe"])
    env = {"path": f"{shims}:{SYSTEM_PATH}", "pyenv_root": root, "home": tmp_path / "home"}
    first = bash(command, **env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert Path(venv_marker(str(venv), "d1")).exists()
    assert bash(f"{venv}/bin/python -c 'import rlgwprobe'", **env).returncode == 0
    # Marked: the second run does nothing (no interpreter, no lock needed, so none is searched for).
    lock.unlink()
    second = bash(command, path=SYSTEM_PATH, home=tmp_path / "home")
    assert second.returncode == 0 and second.stderr == "", second.stderr


def test_a_lock_that_installs_but_does_not_import_fails_the_install_unmarked(tmp_path: Path) -> None:
    root, shims = fake_pyenv(tmp_path, "3.12.7")
    venv = tmp_path / "agent-venv"
    lock = tmp_path / "probe.txt"
    lock.write_text(f"{wheel(tmp_path, 'rlgwprobe', '1.2.3')}\n")
    env = {"path": f"{shims}:{SYSTEM_PATH}", "pyenv_root": root, "home": tmp_path / "home"}
    done = bash(venv_install(str(venv), str(lock), "d2", ["rlgwprobe", "rlgw_absent_module"]), **env)
    assert done.returncode != 0 and "No module named 'rlgw_absent_module'" in done.stderr, done.stderr
    assert not Path(venv_marker(str(venv), "d2")).exists()


def test_npm_install_is_skipped_when_the_pinned_version_is_there(tmp_path: Path) -> None:
    prefix = tmp_path / "npm"
    command = npm_install(str(prefix), "@scope/cli", "1.0.0")
    node = shutil.which("node")
    assert node is not None, "the tests need Node.js"
    # No npm on PATH (node only, in a directory of its own): a missing install says so.
    only_node = tmp_path / "only-node"
    only_node.mkdir()
    (only_node / "node").symlink_to(node)
    missing = bash(command, path=str(only_node), home=tmp_path)
    assert missing.returncode == MISSING_RUNTIME and "needs Node.js" in missing.stderr
    manifest = prefix / "node_modules" / "@scope" / "cli" / "package.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"name": "@scope/cli", "version": "0.9.0"}))
    assert bash(command, path=str(only_node), home=tmp_path).returncode == MISSING_RUNTIME  # other version
    manifest.write_text(json.dumps({"name": "@scope/cli", "version": "1.0.0"}))
    skipped = bash(command, path=str(only_node), home=tmp_path)
    assert skipped.returncode == 0 and skipped.stderr == ""
