"""The session journal's interface on both backends (local files, a real PostgreSQL database): sessions
and turns come back as written, in order, across journals on the same place (another gateway, a
restart), and closing forgets them; the PostgreSQL journal keeps the file journal's record bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlgw.gateway.sessions.journal import SessionJournal, read_frames
from rlgw.gateway.sessions.journals import open_journal
from rlgw.gateway.sessions.pg_journal import PgSessionJournal


@pytest.fixture(params=["files", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return str(tmp_path / "data") if request.param == "files" else request.getfixturevalue("pg_url")


def _record(i: int) -> dict[str, Any]:
    return {"commit": {"prompt_ids": np.arange(i, i + 800, dtype=np.int32), "logprobs": [-0.25] * 60}}


async def test_sessions_and_turns_come_back_in_order_from_another_journal(
    location: str, tmp_path: Path
) -> None:
    journal = open_journal(location, tmp_path, sync="normal")
    again = open_journal(location, tmp_path, sync="full")  # another gateway on the same journal
    try:
        await journal.opened("s-a", {"id": "s-a"}, b"\1" * 32)
        await journal.opened("s-b", {"id": "s-b"}, b"\2" * 32)
        for i in range(30):
            await journal.turn("s-a" if i % 3 else "s-b", _record(i))
        a, b = again.load("s-a"), again.load("s-b")
        assert [t["commit"]["prompt_ids"][0] for t in a.turns] == [i for i in range(30) if i % 3]
        assert [t["commit"]["prompt_ids"][0] for t in b.turns] == [i for i in range(30) if not i % 3]
        assert (a.doc, a.key_digest) == ({"id": "s-a"}, b"\1" * 32)
        assert again.session_for_key(b"\2" * 32) == "s-b" and again.session_for_key(b"\3" * 32) is None
        assert again.session_ids() == ["s-a", "s-b"]
        await again.turn("s-a", _record(99))  # the session moved: its next turn is written there
        assert journal.load("s-a").turns[-1]["commit"]["prompt_ids"][0] == 99
        await journal.closed("s-a")
        assert again.load("s-a") is None and again.session_for_key(b"\1" * 32) is None
        assert again.session_ids() == ["s-b"]
        await journal.ready()
        assert journal.writes == 30 and journal.write_seconds > 0
    finally:
        journal.close()
        again.close()
    with pytest.raises(RuntimeError, match="closed"):
        await journal.turn("s-b", _record(0))


async def test_the_postgresql_journal_stores_the_file_journals_record_bytes(
    pg_url: str, tmp_path: Path
) -> None:
    files, pg = SessionJournal.open(tmp_path), PgSessionJournal.open(pg_url)
    try:
        for j in (files, pg):
            await j.opened("s-x", {"id": "s-x"}, b"\0" * 32)
            for i in range(3):
                await j.turn("s-x", _record(i))
        frames, _ = read_frames((files.turns_dir / "s-x.log").read_bytes())
        import psycopg

        with psycopg.connect(pg_url) as conn:
            rows = conn.execute("SELECT doc FROM rlgw.turns WHERE session = 's-x' ORDER BY seq").fetchall()
        assert [bytes(r[0]) for r in rows] == frames
        # Shared: nothing is restored at start-up (other gateways may be serving it); on demand it is.
        assert pg.load_all() == [] and pg.load("s-x") is not None
    finally:
        files.close()
        pg.close()
