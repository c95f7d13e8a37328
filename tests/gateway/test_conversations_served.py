"""Conversations in a session, served for real: a main agent and its subagent (or a title side call)
interleaved on one session through `rlgw serve` in front of the embedded engine, with the real
`openai` client, and a `kill -9` of the gateway between their turns.

Every stored sample is checked token for token (`tests/support/e2e.py`'s `check_sample`): mask-1
tokens are the engine's sampled ids and logprobs for each of the conversation's turns, each turn fed
exactly the series before it (so a continued conversation whose history was rendered again, or whose
generated text was tokenized again, fails), and mask-0 tokens are the template's own render.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import openai

from tests.gateway.sessions import test_journal
from tests.gateway.sessions.test_journal import KW, _continue, gateway
from tests.support import fixture_prompts as fp
from tests.support.e2e import Run, Stack, check_sample, finish, open_session, stored
from tests.support.procs import free_port

MAIN = {"role": "system", "content": "You are the main agent. Use the tools you have."}
SUB = {"role": "system", "content": "You are a weather subagent. Answer in one line."}
TITLE = {"role": "system", "content": "Write a five-word title for the user's request."}


# The embedded engine on the tiny Qwen3 fixture behind a recording proxy (a module fixture).
world = test_journal.world


def _ask(client: openai.OpenAI, run: Run, messages: list[dict[str, Any]], **extra: Any) -> Any:
    """One turn of an agent (the tools of `fp.TOOLS` unless `tools=None`), recorded in `run`."""
    tools = extra.pop("tools", fp.TOOLS)
    run.requests.append(list(messages))
    reply = client.chat.completions.create(
        model="m",
        messages=messages,
        temperature=0.0,
        max_tokens=48,
        extra_body={"chat_template_kwargs": KW},
        **({"tools": tools} if tools else {}),
        **extra,
    )
    run.replies.append(reply.choices[0].message)
    return reply.choices[0].message


def _step(client: openai.OpenAI, run: Run, messages: list[dict[str, Any]], **extra: Any) -> None:
    """A turn, then what the agent appends: the echo and its tool results (or a follow-up)."""
    _continue(messages, _ask(client, run, messages, **extra))


def _check(st: Stack, summary: dict[str, Any], runs: list[Run], tools: list[Any], rollout: str) -> list[dict]:
    """One accepted sample per conversation, in order, each token-exact; their stored documents."""
    assert summary["rejects"] == [], summary["rejects"]
    assert [x["conversation"] for x in summary["samples"]] == list(range(len(runs)))
    docs = [stored(st, x["cursor"]) for x in summary["samples"]]
    for doc, run, t in zip(docs, runs, tools, strict=True):
        check_sample(st, doc, run, t, KW)
        assert doc["rollout_id"] == rollout
        assert doc["metadata"]["conversations"] == len(runs)
    return docs


def test_interleaved_main_and_subagent_give_one_sample_per_conversation(world: dict, tmp_path: Path) -> None:
    """Main 2 turns, subagent 3, interleaved (main, sub, sub, main, sub): the gateway before conversations
    stored a segment per switch, each `truncation`, and re-rendered each conversation it went back to."""
    port = free_port()
    st = Stack(f"http://127.0.0.1:{port}", world["engine"], world["recorder"], world["tok"])
    main, sub = Run(), Run()
    main_msgs = [MAIN, *fp.WEATHER]
    sub_msgs = [SUB, {"role": "user", "content": "What is the weather in Tokyo?"}]
    with gateway(world["proxy"], tmp_path, port):
        s = open_session(st, task_id="interleaved")
        client = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
        _step(client, main, main_msgs)  # the main agent's call that spawns the subagent
        _step(client, sub, sub_msgs)
        _step(client, sub, sub_msgs)
        _ask(client, main, main_msgs)  # the main agent goes on while its subagent is still at work
        _ask(client, sub, sub_msgs)
        summary = finish(st, s["session_id"])
        assert [c["cause"] for c in summary["segment_causes"]] == ["start", "new_conversation"]
        assert len(summary["samples"]) == 2
        docs = _check(st, summary, [main, sub], [fp.TOOLS, fp.TOOLS], s["rollout_id"])
    assert summary["conversations"] == [
        {"conversation": 0, "parent": None, "segments": [0]},
        {"conversation": 1, "parent": 0, "segments": [1]},
    ]
    assert [(d["metadata"]["conversation"], d["metadata"]["conversation_parent"]) for d in docs] == [
        (0, None),
        (1, 0),
    ]
    # Every turn the engine sampled is in exactly one sample, as sampled (mask 1): none of them was
    # rendered again as text into another sample.
    rids = [d["metadata"]["engine_rids"] for d in docs]
    assert [len(r) for r in rids] == [2, 3] and len({*rids[0], *rids[1]}) == 5


def test_a_title_call_first_leaves_the_main_conversation_without_tools_changed(
    world: dict, tmp_path: Path
) -> None:
    """opencode's pattern: a title side call (own system prompt, no tools), then the main agent."""
    port = free_port()
    st = Stack(f"http://127.0.0.1:{port}", world["engine"], world["recorder"], world["tok"])
    title, main = Run(), Run()
    main_msgs = [MAIN, *fp.WEATHER]
    with gateway(world["proxy"], tmp_path, port):
        s = open_session(st, task_id="title-first")
        client = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
        _ask(client, title, [TITLE, *fp.WEATHER], tools=None)
        for _ in range(2):
            _step(client, main, main_msgs)
        summary = finish(st, s["session_id"])
        causes = [c["cause"] for c in summary["segment_causes"]]
        assert causes == ["start", "new_conversation"] and "tools_changed" not in causes
        _check(st, summary, [title, main], [None, fp.TOOLS], s["rollout_id"])


def test_conversations_survive_a_kill_9_and_restart(world: dict, tmp_path: Path) -> None:
    """The journal replays each turn into its conversation; the subagent names its parent."""
    port = free_port()
    st = Stack(f"http://127.0.0.1:{port}", world["engine"], world["recorder"], world["tok"])
    main, sub = Run(), Run()
    main_msgs = [MAIN, *fp.WEATHER]
    sub_msgs = [SUB, {"role": "user", "content": "What is the weather in Tokyo?"}]
    named = {"extra_headers": {"X-Rlgw-Event": "new_conversation; parent=0"}}
    with gateway(world["proxy"], tmp_path, port) as first:
        s = open_session(st, task_id="restart")
        client = openai.OpenAI(base_url=s["base_url"], api_key=s["api_key"], max_retries=0)
        _step(client, main, main_msgs)
        _step(client, sub, sub_msgs, **named)
        first.send_signal(signal.SIGKILL)
        first.wait()
    with gateway(world["proxy"], tmp_path, port):
        _step(client, main, main_msgs)
        _ask(client, sub, sub_msgs, **named)  # the header names a parent only when a conversation opens
        summary = finish(st, s["session_id"])
        _check(st, summary, [main, sub], [fp.TOOLS, fp.TOOLS], s["rollout_id"])
    assert [c["cause"] for c in summary["segment_causes"]] == ["start", "new_conversation"]
    assert [c["parent"] for c in summary["conversations"]] == [None, 0]
