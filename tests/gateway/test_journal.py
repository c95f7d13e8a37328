"""Crash safety: `kill -9` of the gateway mid-session, a restart on the same data dir, and the
agent's next call (same base URL, same key) continues the same ledger (`gateway/journal.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from transformers import AutoTokenizer

from rlgw.gateway.journal import SessionJournal
from tests.support import fixture_prompts as fp
from tests.support.e2e import Run, Stack, check_sample, echo, finish, open_session, stored, tool_result
from tests.support.procs import engine_server, free_port, wait_healthy
from tests.support.recording_proxy import recording_proxy

KW = {"enable_thinking": False}


@contextlib.contextmanager
def gateway(engine: str, data: Path, port: int) -> Iterator[subprocess.Popen]:
    """`rlgw serve` as a process the test may kill -9; terminated at the end if still alive."""
    args = ["serve", "--engine-url", engine, "--port", str(port), "--data-dir", str(data)]
    log = open(data / f"gateway-{port}.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlgw.bin.main", *args], stdout=log, stderr=subprocess.STDOUT, env=os.environ
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=15)
        log.close()


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
        # A turn in flight: the first streamed chunk arrived, the generation is not finished.
        stream = client.chat.completions.create(
            model="m", messages=messages, tools=fp.TOOLS, stream=True, extra_body={"chat_template_kwargs": KW}
        )
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


async def test_the_wal_stays_bounded_while_turns_keep_coming(tmp_path: Path) -> None:
    # A checkpoint that raced the writes (on another thread) never finished, and the WAL (every
    # row ever written) grew without end. Rows for a second, written without pause.
    journal = SessionJournal.open(tmp_path)
    await journal.opened("s", {"id": "s"}, b"\0" * 32)
    record = {"commit": {"prompt_ids": list(range(100_000, 101_500)), "logprobs": [-0.25] * 60}}
    written, started = 0, time.monotonic()
    while time.monotonic() - started < 1.0:
        for _ in range(10):
            await journal.turn("s", record)
            written += len(orjson.dumps(record))
        await asyncio.sleep(0)
    wal = (tmp_path / "journal.sqlite3-wal").stat().st_size
    journal.close()
    assert wal < written / 3, (wal, written)
    # Nothing was lost on the way: every row is there, in order.
    assert len(SessionJournal.open(tmp_path).load("s").turns) == journal.writes - 1  # - the session row
