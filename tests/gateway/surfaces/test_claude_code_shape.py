"""Claude Code's request shape on the Messages surface, recorded as one sample.

The requests are built from Anthropic's documented fields the way Claude Code sends them: system
text blocks with `cache_control`, a long list of client tools (JSON Schema draft-07 with
`$schema` and `additionalProperties`), user turns that mix `<system-reminder>` text with
`tool_result` blocks whose content is a list (one `is_error`), assistant turns with signed
`thinking` blocks, `thinking` enabled, `metadata.user_id`, beta headers, and streaming. Fields
rlgw has no use for are accepted and ignored. The tiny model is off its training distribution
here, so turns may be cut by `max_tokens`: the checks are the ones that hold for any turn.
"""

from __future__ import annotations

from typing import Any

import anthropic
import numpy as np
import pytest

from rlgw.gateway.surfaces.anthropic.translate import MessagesInput, turn_params
from tests.support.e2e import Stack, finish, mask_runs, open_session, stored

pytestmark = pytest.mark.slow

EPHEMERAL = {"type": "ephemeral"}
SYSTEM = [
    {
        "type": "text",
        "text": "You are Claude Code, Anthropic's official CLI for Claude.",
        "cache_control": EPHEMERAL,
    },
    {
        "type": "text",
        "text": "You are an interactive CLI tool that helps users with software engineering tasks.\n"
        "<env>\nWorking directory: /tmp/data\nIs directory a git repo: No\nPlatform: linux\n</env>",
        "cache_control": EPHEMERAL,
    },
]
TOOL_NAMES = [
    (
        "Task",
        "Launch a new agent to handle complex, multi-step tasks autonomously.",
        {"description", "prompt"},
    ),
    ("Bash", "Executes a given bash command in a persistent shell session.", {"command", "description"}),
    ("Glob", "Fast file pattern matching tool that works with any codebase size.", {"pattern", "path"}),
    ("Grep", "A powerful search tool built on ripgrep.", {"pattern", "path", "glob"}),
    ("LS", "Lists files and directories in a given path.", {"path"}),
    ("Read", "Reads a file from the local filesystem.", {"file_path", "offset", "limit"}),
    ("Edit", "Performs exact string replacements in files.", {"file_path", "old_string", "new_string"}),
    ("MultiEdit", "Makes multiple edits to a single file in one operation.", {"file_path"}),
    ("Write", "Writes a file to the local filesystem.", {"file_path", "content"}),
    ("NotebookEdit", "Replaces the contents of a specific cell in a Jupyter notebook.", {"notebook_path"}),
    ("WebFetch", "Fetches content from a specified URL and processes it.", {"url", "prompt"}),
    ("TodoWrite", "Create and manage a structured task list for your current coding session.", {"todos"}),
    ("WebSearch", "Allows Claude to search the web and use the results.", {"query"}),
    ("BashOutput", "Retrieves output from a running or completed background bash shell.", {"bash_id"}),
    ("KillShell", "Kills a running background bash shell by its ID.", {"shell_id"}),
    (
        "ExitPlanMode",
        "Use this tool when you are in plan mode and have finished presenting your plan.",
        {"plan"},
    ),
]
TOOLS: list[dict[str, Any]] = [
    {
        "name": name,
        "description": description,
        "input_schema": {
            "type": "object",
            "properties": {p: {"type": "string", "description": p.replace("_", " ")} for p in sorted(props)},
            "required": sorted(props)[:1],
            "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#",
        },
    }
    for name, description, props in TOOL_NAMES
]
TOOLS[-1]["cache_control"] = EPHEMERAL
REMINDER = "<system-reminder>\nThis is a reminder that your todo list is currently empty.\n</system-reminder>"
HISTORY: list[dict[str, Any]] = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": REMINDER},
            {"type": "text", "text": "List the files in /tmp/data.", "cache_control": EPHEMERAL},
        ],
    },
    {
        "role": "assistant",
        "content": [
            {
                "type": "thinking",
                "thinking": "The user wants a listing; LS does that.",
                "signature": "EqQBCkYIBxgCKkD",
            },
            {"type": "text", "text": "I'll list the directory."},
            {"type": "tool_use", "id": "toolu_01A9", "name": "LS", "input": {"path": "/tmp/data"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_01A9",
                "content": [{"type": "text", "text": "- /tmp/data/\n  - a.txt\n  - b.txt"}],
            },
            {"type": "text", "text": REMINDER, "cache_control": EPHEMERAL},
        ],
    },
]


def claude_turn(client: anthropic.Anthropic, messages: list[dict[str, Any]]) -> tuple[Any, list[str]]:
    """One streamed request as Claude Code sends it; the reply and the event types seen."""
    with client.messages.stream(
        model="claude-sonnet-4-6",  # the name is passed through; rlgw serves its one model
        max_tokens=64,
        system=SYSTEM,
        messages=messages,
        tools=TOOLS,
        thinking={"type": "enabled", "budget_tokens": 4096},
        metadata={"user_id": "user_2f1e_account__session_8c1d0b2e-5a55-4d3c-9a8a-6e0f2e1f4b7a"},
        extra_headers={"anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"},
        # Claude Code samples at temperature 1; `context_management` is a field rlgw has no use for.
        extra_body={"temperature": 1, "context_management": {"edits": []}},
    ) as s:
        kinds = [e.type for e in s]
        return s.get_final_message(), kinds


def test_claude_code_requests_are_accepted_and_recorded_as_one_sample(qwen3: Stack) -> None:
    s = open_session(qwen3, task_id="claude-code")
    client = anthropic.Anthropic(base_url=qwen3.gateway, api_key=s["api_key"], max_retries=0)
    messages = list(HISTORY)
    first, kinds = claude_turn(client, messages)
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert first.stop_reason in ("end_turn", "tool_use", "max_tokens")
    # The next request: the reply echoed as Claude Code does, then tool results (one an error).
    uses = [b for b in first.content if b.type == "tool_use"]
    results = [
        {
            "type": "tool_result",
            "tool_use_id": b.id,
            "content": [{"type": "text", "text": "denied"}],
            "is_error": True,
        }
        for b in uses
    ]
    messages += [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [*results, {"type": "text", "text": "Now read a.txt."}]},
    ]
    second, _ = claude_turn(client, messages)
    summary = finish(qwen3, s["session_id"])
    assert summary["segments"] == 1 and summary["rejects"] == []
    doc = stored(qwen3, summary["samples"][0]["cursor"])
    tokens = np.asarray(doc["tokens"])
    p = len(tokens) - doc["response_length"]
    runs = [(p + a, p + b) for a, b in mask_runs(np.asarray(doc["loss_mask"]))]
    rids = doc["metadata"]["engine_rids"]
    assert len(runs) == len(rids) == 2
    # Mask 1: the engine's output ids for each turn, fed exactly the series before it.
    for (a, b), rid in zip(runs, rids, strict=True):
        ex = qwen3.recorder.by_rid[rid]
        assert tokens[a:b].tolist() == ex.output_ids and ex.input_ids == tokens[:a].tolist()
    assert second.usage.output_tokens == runs[1][1] - runs[1][0]
    # Mask 0 of the first prompt: the template's render of the translated conversation.
    params = turn_params(
        MessagesInput(messages=HISTORY, system=SYSTEM, tools=TOOLS, thinking={"type": "enabled"})
    )
    prompt = qwen3.tokenizer.apply_chat_template(
        params.messages,
        tools=params.tools,
        add_generation_prompt=True,
        tokenize=False,
        enable_thinking=True,
    )
    assert qwen3.tokenizer.decode(tokens[:p].tolist()) == prompt
    assert "You are Claude Code" in prompt and "- /tmp/data/" in prompt and '"name": "KillShell"' in prompt
