"""Both trajectory-store backends for parametrized tests: SQLite in a temp dir, PostgreSQL in a fresh
database of the session's throwaway cluster (skipped, saying why, where PostgreSQL is absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

BACKENDS = ["sqlite", "postgresql"]


def store_location(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> str:
    """Where a store of `kind` lives for this test: a data dir, or a new database's URL."""
    if kind == "sqlite":
        return str(tmp_path / "data")
    return request.getfixturevalue("pg_url")


def integrity_errors() -> tuple[type[BaseException], ...]:
    """What each backend raises for a row that breaks a constraint."""
    import sqlite3

    import psycopg

    return (sqlite3.IntegrityError, psycopg.errors.IntegrityError)
