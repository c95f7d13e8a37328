"""The Python agents' committed dependency sets: one pip requirements file per agent release.

Each `<distribution>-<version>.txt` here pins every distribution a working venv of that agent
held (`pip freeze` of a Python 3.12 venv in which `pip install <distribution>==<version>`
resolved from PyPI, whose agent then imported and ran a task), so an install next month gets
what the tests ran rather than what pip resolves that day (OpenHands died at import once when
a new fastmcp met an mcp it did not fit). The venv is filled with `pip install --no-deps -r`
the file: exactly the pinned set, nothing resolved. `python -m rlgw.scaffolds.locks DIST==VER`
makes a new one. This package knows nothing about sandboxes or any agent's settings.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

LOCKS_DIR = Path(__file__).resolve().parent
# One pinned distribution per line: `name==version` (comments and blank lines aside).
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")


class MissingLockError(ValueError):
    """No committed lock for the agent release asked for."""


@dataclass(frozen=True, slots=True)
class Lock:
    """The committed dependency set of `distribution` at `version` (its file under `LOCKS_DIR`)."""

    distribution: str
    version: str

    @property
    def path(self) -> Path:
        return LOCKS_DIR / f"{self.distribution}-{self.version}.txt"

    def text(self) -> str:
        """The requirements file itself."""
        return self.path.read_text()

    def digest(self) -> str:
        """A short hash of the file: a venv built from another lock is another venv."""
        return hashlib.sha256(self.path.read_bytes()).hexdigest()[:12]

    def pins(self) -> dict[str, str]:
        """Normalized distribution name -> pinned version; raises `ValueError` on a line that pins nothing."""
        pins = {}
        for n, line in enumerate(self.text().splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if (m := PIN.match(line)) is None:
                raise ValueError(f"{self.path.name}:{n}: {line!r} is not a `name==version` pin")
            pins[normalize(m[1])] = m[2]
        return pins


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_for(distribution: str, version: str) -> Lock:
    """The committed lock of `distribution` `version`, or `MissingLockError` naming the locked versions."""
    lock = Lock(distribution, version)
    if not lock.path.exists():
        versions = (p.stem.removeprefix(f"{distribution}-") for p in LOCKS_DIR.glob(f"{distribution}-*.txt"))
        have = sorted(v for v in versions if v[:1].isdigit())  # not `openhands-ai-...` for `openhands`
        raise MissingLockError(
            f"no dependency lock for {distribution} {version} (locked: {', '.join(have) or 'none'}); "
            f"make one with `python -m rlgw.scaffolds.locks {distribution}=={version}`"
        )
    return lock
