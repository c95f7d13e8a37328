"""A throwaway PostgreSQL cluster for tests (pytest fixtures `pg_cluster`, `pg_url`): `initdb` and
`pg_ctl` in a temp dir, one per test session.

The cluster listens on a free loopback port (and a unix socket in its own dir), trusts local
connections, and runs without fsync (a test cluster need not survive a power cut; its
commits are still real transactions, which is what the tests check). PostgreSQL refuses to
run as root, so under root (CI) it runs as `nobody` through `runuser`. Each test gets its own
database (`fresh_url`) so tests never see each other's rows.

Where no `initdb` exists (neither on PATH nor under /usr/lib/postgresql/*/bin) the fixtures
skip, saying how to install it: `apt-get install -y postgresql`.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.procs import free_port

INSTALL_HINT = "no PostgreSQL server here (initdb not found); install it with `apt-get install -y postgresql`"
UNPRIVILEGED = "nobody"  # postgres refuses to run as root


def find_bin_dir() -> Path | None:
    """The directory holding `initdb` and `pg_ctl`: PATH first, then Debian's versioned dirs."""
    if found := shutil.which("initdb"):
        return Path(found).resolve().parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(dirs[-1]).parent if dirs else None


@dataclass
class Cluster:
    """A running cluster: its data dir, port, and the next fresh database's number."""

    bin_dir: Path
    root: Path
    port: int
    durable: bool = False  # fsync on, as a production server (benches); tests run without
    _serial: itertools.count = field(default_factory=lambda: itertools.count(1))

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def url(self, dbname: str = "postgres") -> str:
        """A libpq URL for `dbname` as the superuser `postgres`, over TCP on loopback."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def _run(self, *args: str) -> None:
        cmd = [str(self.bin_dir / args[0]), *args[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", UNPRIVILEGED, "--", *cmd]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=self.root)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")

    def start(self) -> None:
        """Start the server (also after `stop`) and wait until it accepts connections."""
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=200"
        if not self.durable:
            opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        self._run(
            "pg_ctl", "-D", str(self.data_dir), "-l", str(self.root / "server.log"), "-o", opts, "-w", "start"
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (`immediate` is a crash: no shutdown checkpoint)."""
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", mode, "-w", "stop")

    def fresh_url(self) -> str:
        """A URL of a new, empty database (one per test)."""
        import psycopg

        name = f"t{next(self._serial)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)


@contextlib.contextmanager
def cluster(*, durable: bool = False) -> Iterator[Cluster]:
    """Create, start, and at the end stop and remove a cluster (raises if PostgreSQL is absent)."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise FileNotFoundError(INSTALL_HINT)
    # Not under pytest's tmp dir (private to root) when the server runs as `nobody`: under /tmp,
    # whose parents `nobody` can traverse whatever $TMPDIR says.
    root = Path(tempfile.mkdtemp(prefix="rlgw-pg-", dir="/tmp" if os.geteuid() == 0 else None))
    try:
        if os.geteuid() == 0:
            shutil.chown(root, UNPRIVILEGED)
        c = Cluster(bin_dir, root, free_port(), durable)
        c._run("initdb", "-D", str(c.data_dir), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
        c.start()
        try:
            yield c
        finally:
            with contextlib.suppress(RuntimeError):
                c.stop("immediate")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """One cluster for the whole test session; skips (saying how to install it) where none can run."""
    if find_bin_dir() is None:
        pytest.skip(INSTALL_HINT)
    with cluster() as c:
        yield c


@pytest.fixture
def pg_url(pg_cluster: Cluster) -> str:
    """A new, empty database on the session's cluster."""
    return pg_cluster.fresh_url()
