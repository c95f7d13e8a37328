"""Crash safety: `kill -9` of the gateway mid-session, a restart on the same data dir, and the
agent's next call (same base URL, same key) continues the same ledger (`gateway/sessions/journal.py`)."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from transformers import AutoTokenizer

from rlgw.gateway.sessions import journal as journal_module
from rlgw.gateway.sessions.journal import SessionJournal
from tests.support import fixture_prompts as fp
from tests.support.e2e import Run, Stack, check_sample, echo, finish, open_session, stored, tool_result
from tests.support.gateway_proc import gateway_on_port as gateway
from tests.support.procs import engine_server, free_port
from tests.support.recording_proxy import recording_proxy

KW = {"enable_thinking": False}


@pytest.fixture(scope="module")
def world(tiny_qwen3: Path) -> Iterator[dict[str, Any]]:
    with engine_server(tiny_qwen3) as engine, recording_proxy(engine) as (proxy, recorder):
        yield {
            "engine": engine,
            "proxy": proxy,
            "recorder": recorder,
            "tok": AutoTokenizer.from_pretrained(tiny_qwen3),
        }


def _call(client: openai.OpenAI, run: Run, messages: list[dict[str, Any]]) -> Any:
    run.requests.append(list(messages))
    msg = (
        client.chat.completions.create(
            model="m",
            messages=messages,
            tools=fp.TOOLS,
            temperature=0.0,
            extra_body={"chat_template_kwargs": KW},
        )
        .choices[0]
        .message
    )
    run.replies.append(msg)
    return msg


def _continue(messages: list[dict[str, Any]], msg: Any) -> None:
    messages.append(echo(msg, reserialize=True, drop_reasoning=True))
    if msg.tool_calls:
        messages += [
            {"role": "tool", "tool_call_id": c.id, "content": tool_result(c)} for c in msg.tool_calls
        ]
    else:
        messages.append({"role": "user", "content": "What is the weather in Berlin?"})


def test_kill_9_between_turns_then_restart_continues_the_same_ledger(world: dict, tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    st = Stack(base, world["engine"], world["recorder"], world["tok"])
    run, messages = Run(), list(fp.WEATHER)
    with gateway(world["proxy"], tmp_path, port) as first:
        s = open_session(st, task_id="crash")
        client = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
        msg = _call(client, run, messages)
        _continue(messages, msg)
        first.send_signal(signal.SIGKILL)
        first.wait()
    with gateway(world["proxy"], tmp_path, port):
        for _ in range(3):
            msg = _call(client, run, messages)  # same base URL, same key
            _continue(messages, msg)
        doc = httpx.get(base + f"/v1/sessions/{s['session_id']}").json()
        assert doc["turns"] == 4 and doc["segments"] == 1
        summary = finish(st, s["session_id"])
        assert len(summary["samples"]) == 1 and summary["rejects"] == []
        check_sample(st, stored(st, summary["samples"][0]["cursor"]), run, fp.TOOLS, KW)


def test_kill_9_during_a_turn_leaves_it_absent_and_the_session_goes_on(world: dict, tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    st = Stack(base, world["engine"], world["recorder"], world["tok"])
    run, messages = Run(), list(fp.WEATHER)
    with gateway(world["proxy"], tmp_path, port) as first:
        s = open_session(st, task_id="crash-mid-turn")
        client = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
        msg = _call(client, run, messages)
        _continue(messages, msg)
        # A turn in flight: the first streamed chunk arrived, the generation is not finished (it runs past
        # its end-of-turn token to 1500 tokens, seconds on this engine, so the kill cannot come after it).
        stream = client.chat.completions.create(
            model="m", messages=messages, tools=fp.TOOLS, stream=True, max_tokens=1500,
            extra_body={"chat_template_kwargs": KW, "ignore_eos": True},
        )  # fmt: skip
        next(iter(stream))
        first.send_signal(signal.SIGKILL)
        first.wait()
    with gateway(world["proxy"], tmp_path, port):
        assert httpx.get(base + f"/v1/sessions/{s['session_id']}").json()["turns"] == 1
        msg = _call(client, run, messages)  # the agent's retry regenerates the lost turn
        summary = finish(st, s["session_id"])
        assert len(summary["samples"]) == 1 and summary["rejects"] == []
        check_sample(st, stored(st, summary["samples"][0]["cursor"]), run, fp.TOOLS, KW)


def test_an_unused_session_survives_and_finish_forgets_it(world: dict, tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    st = Stack(base, world["engine"], world["recorder"], world["tok"])
    with gateway(world["proxy"], tmp_path, port) as first:
        s = open_session(st, task_id="unused", metadata={"k": "v"}, group_index=3)
        first.send_signal(signal.SIGKILL)
        first.wait()
    with gateway(world["proxy"], tmp_path, port) as second:
        doc = httpx.get(base + f"/v1/sessions/{s['session_id']}").json()
        assert (doc["task_id"], doc["group_index"], doc["metadata"]) == ("unused", 3, {"k": "v"})
        # The key works on the key-only base URL too.
        client = openai.OpenAI(base_url=base + "/v1", api_key=s["api_key"], max_retries=0)
        client.chat.completions.create(model="m", messages=fp.PLAIN, max_tokens=8)
        summary = finish(st, s["session_id"])
        assert len(summary["samples"]) == 1
        second.send_signal(signal.SIGKILL)
        second.wait()
    with gateway(world["proxy"], tmp_path, port):
        assert httpx.get(base + f"/v1/sessions/{s['session_id']}").status_code == 404


def test_a_second_gateway_on_the_data_dir_restores_a_session_it_does_not_hold(
    world: dict, tmp_path: Path
) -> None:
    p1, p2 = free_port(), free_port()
    st1 = Stack(f"http://127.0.0.1:{p1}", world["engine"], world["recorder"], world["tok"])
    st2 = Stack(f"http://127.0.0.1:{p2}", world["engine"], world["recorder"], world["tok"])
    with gateway(world["proxy"], tmp_path, p1), gateway(world["proxy"], tmp_path, p2):
        s = open_session(st1, task_id="shared")
        run, messages = Run(), list(fp.WEATHER)
        c1 = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
        _continue(messages, _call(c1, run, messages))
        # The load balancer moved the agent: same path and key, another gateway process.
        c2 = openai.OpenAI(
            base_url=s["base_url"].replace(str(p1), str(p2)), api_key=s["api_key"], max_retries=0
        )
        _call(c2, run, messages)
        summary = finish(st2, s["session_id"])
        assert len(summary["samples"]) == 1
        check_sample(st2, stored(st2, summary["samples"][0]["cursor"]), run, fp.TOOLS, KW)


def test_a_session_whose_finish_was_stored_is_not_restored(world: dict, tmp_path: Path) -> None:
    """Killed between storing a finish and forgetting its journal rows: the restart must not hold
    the session again (a second finish would store its samples twice)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    st = Stack(base, world["engine"], world["recorder"], world["tok"])
    with gateway(world["proxy"], tmp_path, port) as first:
        s = open_session(st, task_id="stored")
        client = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
        client.chat.completions.create(model="m", messages=fp.PLAIN, max_tokens=8)
        journal = SessionJournal.open(tmp_path)
        saved = journal.load(s["session_id"])
        assert saved is not None
        assert len(finish(st, s["session_id"])["samples"]) == 1
        # Put back what finish removed from the journal, as if the kill came just before that.
        journal._run(
            "INSERT INTO sessions (id, doc, key) VALUES (?, ?, ?)",
            (s["session_id"], orjson.dumps(saved.doc), saved.key_digest),
        )
        first.send_signal(signal.SIGKILL)
        first.wait()
        journal.close()
    with gateway(world["proxy"], tmp_path, port):
        assert httpx.get(base + f"/v1/sessions/{s['session_id']}").status_code == 404
    assert SessionJournal.open(tmp_path).session_ids() == []


def _record(i: int) -> dict[str, Any]:
    return {"commit": {"prompt_ids": list(range(i, i + 800)), "logprobs": [-0.25] * 60}}


async def test_turns_come_back_in_order_and_finish_removes_them(tmp_path: Path) -> None:
    journal = SessionJournal.open(tmp_path)
    await journal.opened("s-a", {"id": "s-a"}, b"\1" * 32)
    await journal.opened("s-b", {"id": "s-b"}, b"\2" * 32)
    for i in range(50):
        await journal.turn("s-a" if i % 3 else "s-b", _record(i))
    again = SessionJournal.open(tmp_path)
    a, b = again.load("s-a"), again.load("s-b")
    assert [t["commit"]["prompt_ids"][0] for t in a.turns] == [i for i in range(50) if i % 3]
    assert [t["commit"]["prompt_ids"][0] for t in b.turns] == [i for i in range(50) if not i % 3]
    assert (a.doc, a.key_digest) == ({"id": "s-a"}, b"\1" * 32)
    await journal.closed("s-a")
    assert again.load("s-a") is None and again.session_for_key(b"\1" * 32) is None
    assert sorted(p.name for p in journal.turns_dir.iterdir()) == ["s-b.log"]
    journal.close()
    again.close()


async def test_a_frame_cut_by_a_kill_is_dropped_and_the_next_turn_follows_the_last_whole_one(
    tmp_path: Path,
) -> None:
    journal = SessionJournal.open(tmp_path)
    await journal.opened("s-a", {"id": "s-a"}, b"k")
    for i in range(3):
        await journal.turn("s-a", _record(i))
    journal.close()
    path = journal.turns_dir / "s-a.log"
    whole = path.read_bytes()
    for cut in (whole[: len(whole) - 100], whole + b"\x00\x01"):  # a frame cut short; a header cut short
        path.write_bytes(cut)
        restarted = SessionJournal.open(tmp_path)
        kept = len(restarted.load("s-a").turns)
        await restarted.turn("s-a", _record(7))  # the holder's next turn
        turns = restarted.load("s-a").turns
        assert [t["commit"]["prompt_ids"][0] for t in turns] == [*[0, 1, 2][:kept], 7]
        restarted.close()
    # A flipped byte inside a frame fails its CRC: that frame and everything after are dropped.
    path.write_bytes(whole[:20] + bytes([whole[20] ^ 0xFF]) + whole[21:])
    assert SessionJournal.open(tmp_path).load("s-a").turns == []


async def test_a_failed_append_leaves_the_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = SessionJournal.open(tmp_path)
    await journal.opened("s-a", {"id": "s-a"}, b"k")
    await journal.turn("s-a", _record(0))
    path = journal.turns_dir / "s-a.log"
    before = path.read_bytes()
    real_write = os.write

    def half_then_full(fd: int, data: bytes) -> int:
        real_write(fd, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError):
        await journal.turn("s-a", _record(1))
    monkeypatch.undo()
    assert path.read_bytes() == before
    await journal.turn("s-a", _record(2))
    assert [t["commit"]["prompt_ids"][0] for t in journal.load("s-a").turns] == [0, 2]
    journal.close()


async def test_start_up_removes_turn_files_whose_session_is_gone(tmp_path: Path) -> None:
    journal = SessionJournal.open(tmp_path)
    await journal.opened("s-a", {"id": "s-a"}, b"k")
    await journal.turn("s-a", _record(0))
    await journal.turn("s-gone", _record(1))  # as if killed between deleting the row and the file
    (journal.turns_dir / "s-odd.tmp").write_bytes(b"")  # not a turn file: left alone
    assert [s.doc["id"] for s in journal.load_all()] == ["s-a"]
    assert sorted(p.name for p in journal.turns_dir.iterdir()) == ["s-a.log", "s-odd.tmp"]
    journal.close()


async def test_a_session_id_that_cannot_name_a_file_has_no_turns(tmp_path: Path) -> None:
    journal = SessionJournal.open(tmp_path)
    await journal.opened("s/../../x", {"id": "x"}, b"k")
    with pytest.raises(ValueError, match="cannot name a journal file"):
        await journal.turn("s/../../x", _record(0))
    assert journal.load("s/../../x").turns == []
    assert list(journal.turns_dir.iterdir()) == [] and not (tmp_path.parent / "x.log").exists()
    journal.close()


def test_a_journal_of_the_first_design_is_moved_into_files(tmp_path: Path) -> None:
    import sqlite3

    old = sqlite3.connect(tmp_path / "journal.sqlite3", isolation_level=None)
    old.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, doc BLOB NOT NULL, key BLOB NOT NULL)")
    old.execute("CREATE TABLE turns (seq INTEGER PRIMARY KEY, session TEXT NOT NULL, doc BLOB NOT NULL)")
    for sid in ("s-a", "s-b"):
        old.execute("INSERT INTO sessions VALUES (?, ?, ?)", (sid, orjson.dumps({"id": sid}), sid.encode()))
    for i in range(6):
        old.execute(
            "INSERT INTO turns (session, doc) VALUES (?, ?)",
            (("s-a", "s-b")[i % 2], orjson.dumps(_record(i))),
        )
    old.close()
    journal = SessionJournal.open(tmp_path)
    firsts = {s.doc["id"]: [t["commit"]["prompt_ids"][0] for t in s.turns] for s in journal.load_all()}
    assert firsts == {"s-a": [0, 2, 4], "s-b": [1, 3, 5]}
    assert journal._conn.execute("SELECT name FROM sqlite_master WHERE name = 'turns'").fetchone() is None
    journal.close()


def _open_turn_files(journal: SessionJournal) -> set[str]:
    """The turn files this process holds open."""
    names = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(journal.turns_dir)):
                names.add(Path(target).name)
    return names


async def test_open_turn_files_are_bounded_and_closed_before_their_file_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_module, "OPEN_FILES", 3)
    journal = SessionJournal.open(tmp_path)
    ids = [f"s-{i}" for i in range(5)]
    for sid in ids:
        await journal.opened(sid, {"id": sid}, sid.encode())
    for i in range(15):  # round robin: every append past the third evicts the least recent file
        await journal.turn(ids[i % 5], _record(i))
    assert _open_turn_files(journal) == {"s-2.log", "s-3.log", "s-4.log"}
    await journal.closed("s-4")  # held open: closed, then removed
    assert _open_turn_files(journal) == {"s-2.log", "s-3.log"}
    assert not (journal.turns_dir / "s-4.log").exists()
    again = SessionJournal.open(tmp_path)
    for k, sid in enumerate(ids[:4]):
        assert [t["commit"]["prompt_ids"][0] for t in again.load(sid).turns] == [k, k + 5, k + 10]
    assert again.load("s-4") is None
    journal.close()
    again.close()
    assert _open_turn_files(journal) == set()
