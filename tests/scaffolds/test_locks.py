"""The Python agents' committed locks (`scaffolds/locks/`): well formed, one per scaffold release, complete,
and still resolvable on the package index.

The resolve check is what CI's default run keeps of the agents whose install is too slow for it
(OpenHands): `pip install --dry-run --no-deps` of each lock for Python 3.12 finds every pinned release on
the index, and the metadata pip reports for them says every dependency of every pinned distribution is
itself pinned, at a version it accepts (markers evaluated for Python 3.12 on Linux, extras aside).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from rlgw.scaffolds.aider import AiderScaffold
from rlgw.scaffolds.hermes import HermesScaffold
from rlgw.scaffolds.locks import LOCKS_DIR, Lock, lock_for, normalize
from rlgw.scaffolds.mini_swe_agent import MiniSweAgentScaffold
from rlgw.scaffolds.openhands import DEFAULT_VERSIONS, DISTRIBUTIONS
from rlgw.scaffolds.terminus import Terminus2Scaffold

LOCKS = [Lock(*p.stem.rsplit("-", 1)) for p in sorted(LOCKS_DIR.glob("*.txt"))]
# Markers as pip evaluates them in the agents' venvs.
ENVIRONMENT = {
    "python_version": "3.12",
    "python_full_version": "3.12.1",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}


def test_every_scaffold_release_has_a_lock_naming_it() -> None:
    releases = [(DISTRIBUTIONS[v], DEFAULT_VERSIONS[v]) for v in ("v0", "v1")]
    releases += [
        ("harbor", Terminus2Scaffold().harbor_version),
        ("mini-swe-agent", MiniSweAgentScaffold().version),
        ("aider-chat", AiderScaffold().version),
        ("hermes-agent", HermesScaffold().version),
    ]
    for distribution, version in releases:
        assert lock_for(distribution, version).pins()[normalize(distribution)] == version


@pytest.mark.parametrize("lock", LOCKS, ids=[lock.path.name for lock in LOCKS])
def test_a_lock_pins_each_distribution_once(lock: Lock) -> None:
    lines = [ln for ln in lock.text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(lock.pins()) == len(lines) >= 10
    assert "pip" not in lock.pins()  # the venv brings its own


def test_a_line_that_pins_nothing_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rlgw.scaffolds.locks.LOCKS_DIR", tmp_path)
    (tmp_path / "agent-1.0.txt").write_text("# a lock\nagent==1.0\nrequests>=2\n")
    with pytest.raises(ValueError, match=r"agent-1.0.txt:3: 'requests>=2' is not a `name==version` pin"):
        Lock("agent", "1.0").pins()


async def dry_run(lock: Lock, report: Path) -> tuple[int, str]:
    """`pip install --dry-run --no-deps` of the lock for Python 3.12; pip's JSON report goes to `report`."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "-q",
        "--python-version", "3.12", "--target", str(report.parent / "target"), "--report", str(report),
        "-r", str(lock.path), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode(errors="replace")


def unmet(lock: Lock, report: dict) -> list[str]:
    """Each dependency of a pinned distribution (as its metadata says) that the lock leaves out or misses."""
    pins = lock.pins()
    missing = []
    for item in report["install"]:
        meta = item["metadata"]
        for line in meta.get("requires_dist") or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(ENVIRONMENT):
                continue
            pinned = pins.get(normalize(req.name))
            if pinned is None or not req.specifier.contains(pinned, prereleases=True):
                missing.append(f"{meta['name']} needs {line} (pinned: {pinned})")
    return missing


@pytest.mark.slow
async def test_every_lock_is_complete_and_resolves_on_the_index(tmp_path: Path) -> None:
    reports = [tmp_path / lock.path.stem / "report.json" for lock in LOCKS]
    for report in reports:
        report.parent.mkdir()
    runs = await asyncio.gather(*(dry_run(lock, report) for lock, report in zip(LOCKS, reports, strict=True)))
    for lock, report, (code, out) in zip(LOCKS, reports, runs, strict=True):
        assert code == 0, f"{lock.path.name} no longer resolves:\n{out[-3000:]}"
        doc = json.loads(report.read_text())
        assert {normalize(i["metadata"]["name"]) for i in doc["install"]} == set(lock.pins()), lock.path.name
        assert unmet(lock, doc) == [], lock.path.name
