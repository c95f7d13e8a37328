"""SGLang killed with SIGKILL in the middle of a turn: the agent gets a retryable error, the session
records nothing of that turn, and it goes on once SGLang is back on the same address.

Its own SGLang and gateway (the session's stack is not killed): two SGLang start-ups, so slow.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from tests.support import fixture_prompts as fp
from tests.support.e2e import Stack, check_engine_spans, finish, open_session, stored
from tests.support.procs import free_port, rlgw_process
from tests.support.recording_proxy import recording_proxy
from tests.support.sglang_env import sglang_python, start_sglang, stop_sglang

pytestmark = pytest.mark.slow


def _chat(s: dict[str, Any], messages: list[Any], **extra: Any) -> httpx.Response:
    body = {"model": "m", "messages": messages, "temperature": 0.0, "max_tokens": 12, **extra}
    body["chat_template_kwargs"] = {"enable_thinking": False}
    headers = {"Authorization": f"Bearer {s['api_key']}"}
    return httpx.post(s["base_url"] + "/chat/completions", json=body, headers=headers, timeout=120)


def test_sglang_killed_mid_turn_then_back(tiny_qwen3: Path, tmp_path: Path) -> None:
    sglang_python()
    model = shutil.copytree(tiny_qwen3, tmp_path / "model")
    port = free_port()
    proc = start_sglang(model, port, log=tmp_path / "sglang.log")
    try:
        with recording_proxy(f"http://127.0.0.1:{port}") as (proxy, recorder):
            gw_port = free_port()
            args = ["--log-level", "warning", "serve", "--engine-url", proxy, "--port", str(gw_port)]
            with rlgw_process([*args, "--data-dir", str(tmp_path / "store")], "/health", gw_port) as gw:
                st = Stack(gw, f"http://127.0.0.1:{port}", recorder, AutoTokenizer.from_pretrained(model))
                s = open_session(st, task_id="killed")
                first = _chat(s, fp.PLAIN)
                assert first.status_code == 200, first.text
                reply = first.json()["choices"][0]["message"]
                history = [*fp.PLAIN, reply, {"role": "user", "content": "Again?"}]
                before = httpx.get(gw + f"/v1/sessions/{s['session_id']}").json()

                got: dict[str, httpx.Response] = {}
                turn = threading.Thread(
                    target=lambda: got.update(r=_chat(s, history, max_tokens=3000, ignore_eos=True))
                )
                turn.start()
                time.sleep(1.5)  # the turn is generating
                os.killpg(proc.pid, signal.SIGKILL)
                turn.join(120)
                failed = got["r"]
                # A retryable status with OpenAI's error body: the SDKs retry 5xx.
                assert failed.status_code in (502, 503, 504), failed.text
                assert isinstance(failed.json()["error"]["message"], str)
                after = httpx.get(gw + f"/v1/sessions/{s['session_id']}").json()
                assert after["tokens"] == before["tokens"] and after["failed_turns"] == 1

                stop_sglang(proc)
                proc = start_sglang(model, port, log=tmp_path / "sglang.log")  # back, same address
                again = _chat(s, history)
                assert again.status_code == 200, again.text
                summary = finish(st, s["session_id"])
                assert summary["rejects"] == [] and len(summary["samples"]) == 1
                doc = stored(st, summary["samples"][0]["cursor"])
                assert len(check_engine_spans(st, doc)) == 2  # the two turns that answered, nothing else
    finally:
        stop_sglang(proc)
