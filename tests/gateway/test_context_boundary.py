"""The context-length check at its boundary, over real HTTP: `rlgw serve` in front of a scripted engine.

With a context of C tokens and a prompt of P: `max_tokens == C - P` fits and reaches the engine
as `max_new_tokens`; one more is refused with OpenAI's `context_length_exceeded` before the engine
is called; a chat request without `max_tokens` gives the engine exactly the room left, `C - P`
(a completions request asks for OpenAI's legacy default of 16); a prompt of C tokens leaves no
room at all. Completions with token-id prompts give P exactly; chat learns P
from what the engine received for the same rendered messages.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.fault_engine import FaultEngine, fault_engine
from tests.support.procs import free_port, rlgw_process

CONTEXT = 64
TOKEN = 100  # any id of the tiny Qwen3 vocabulary; the scripted engine does not read the prompt
USER = [{"role": "user", "content": "hi"}]
LEGACY_DEFAULT = 16  # /v1/completions' max_tokens when absent (OpenAI's legacy API)


@pytest.fixture(scope="module")
def fe(tiny_qwen3: Path) -> Iterator[FaultEngine]:
    with fault_engine(tiny_qwen3) as engine:
        yield engine


@pytest.fixture(scope="module")
def gw(fe: FaultEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    data = tmp_path_factory.mktemp("store")
    args = ["serve", "--engine-url", fe.url, "--port", str(port), "--data-dir", str(data)]
    with rlgw_process([*args, "--context-length", str(CONTEXT)], "/health", port) as url:
        yield url


@pytest.fixture(autouse=True)
def _reset(fe: FaultEngine) -> None:
    fe.script.clear()
    fe.calls.clear()


def client(gw: str) -> openai.OpenAI:
    """A client on a fresh session (so each request renders the same first prompt)."""
    r = httpx.post(gw + "/v1/sessions", json={"task_id": "t"})
    assert r.status_code == 200, r.text
    s = r.json()
    return openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)


def complete(gw: str, fe: FaultEngine, prompt_len: int, **extra: Any) -> int:
    """`max_new_tokens` the engine was given for a prompt of `prompt_len` ids."""
    client(gw).completions.create(model="m", prompt=[TOKEN] * prompt_len, **extra)
    body = fe.calls[-1]
    assert len(body["input_ids"]) == prompt_len
    return body["sampling_params"]["max_new_tokens"]


def refused(fe: FaultEngine, create: Any, **body: Any) -> str | None:
    """The error code of `create(**body)`, which must fail with 400 without reaching the engine."""
    calls = len(fe.calls)
    with pytest.raises(openai.BadRequestError) as err:
        create(model="m", **body)
    assert err.value.status_code == 400 and len(fe.calls) == calls
    return err.value.code


@pytest.mark.parametrize("prompt_len", [1, 40, CONTEXT - 1])
def test_completions_exact_fit_is_served_and_one_more_is_refused(
    gw: str, fe: FaultEngine, prompt_len: int
) -> None:
    room = CONTEXT - prompt_len
    assert complete(gw, fe, prompt_len, max_tokens=room) == room
    over = refused(fe, client(gw).completions.create, prompt=[TOKEN] * prompt_len, max_tokens=room + 1)
    assert over == "context_length_exceeded"


def test_completions_without_max_tokens_ask_for_openais_default_of_16(gw: str, fe: FaultEngine) -> None:
    assert complete(gw, fe, 1) == LEGACY_DEFAULT
    assert complete(gw, fe, CONTEXT - LEGACY_DEFAULT) == LEGACY_DEFAULT
    over = refused(fe, client(gw).completions.create, prompt=[TOKEN] * (CONTEXT - LEGACY_DEFAULT + 1))
    assert over == "context_length_exceeded"


@pytest.mark.parametrize("prompt_len", [CONTEXT, CONTEXT + 1])
def test_a_prompt_that_fills_the_context_is_refused_whatever_max_tokens(
    gw: str, fe: FaultEngine, prompt_len: int
) -> None:
    create = client(gw).completions.create
    assert refused(fe, create, prompt=[TOKEN] * prompt_len, max_tokens=1) == "context_length_exceeded"


def test_chat_boundary_on_the_rendered_prompt(gw: str, fe: FaultEngine) -> None:
    first = client(gw).chat.completions.create(model="m", messages=USER, max_tokens=1)
    prompt_len = len(fe.calls[-1]["input_ids"])
    assert first.usage is not None and first.usage.prompt_tokens == prompt_len
    room = CONTEXT - prompt_len
    assert room > 1
    client(gw).chat.completions.create(model="m", messages=USER, max_tokens=room)
    assert fe.calls[-1]["sampling_params"]["max_new_tokens"] == room
    client(gw).chat.completions.create(model="m", messages=USER)
    assert fe.calls[-1]["sampling_params"]["max_new_tokens"] == room
    over = refused(fe, client(gw).chat.completions.create, messages=USER, max_tokens=room + 1)
    assert over == "context_length_exceeded"
