"""The typed turn record writes the journal's rows byte for byte as they have always been written,
and reads back rows of every format the journal has held."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from rlgw.gateway.ledger.record import TurnRecord

OPT = orjson.OPT_SERIALIZE_NUMPY

# A recorded turn's row, keys in the order the journal has always written them.
ROW: dict[str, Any] = {
    "invalidate": None,
    "context_exhausted": False,
    "version": "v7",
    "conversation": 1,
    "parent": 0,
    "segment": ["new_conversation", "a subagent"],
    "replace": True,
    "echo_matches": [[0, "ids_in_text"]],
    "echo_edits": [[0, "content"]],
    "overridden": {"temperature": 0.3},
    "notes": {"tool_choice": [{"turn": 0}]},
    "temperature": 0.7,
    "commit": {
        "new_messages": None,
        "records": [["user", 123456789]],
        "prompt_ids": [1, 2, 3],
        "output_ids": [5, 6],
        "logprobs": [-0.5, -0.25],
        "version_spans": [["v7", 0, 1], ["v8", 1, 2]],
        "response_id": "chatcmpl-x",
        "tool_call_ids": ["call_1"],
        "content": "4",
        "rid": "r1",
        "finish_type": "stop",
        "ended_with_stop_token": True,
        "parse_errors": [{"kind": "k", "detail": "d", "raw": "r"}],
        "agent_text": "",
        "surface": "chat",
        "tools": 17,
        "calls": [["add", '{"a":2}']],
        "history": [3, 4, 5],
    },
}


def test_a_row_read_back_is_written_again_byte_for_byte() -> None:
    for row in (ROW, {"invalidate": "rewritten", "context_exhausted": True, "version": "v1"}):
        assert orjson.dumps(TurnRecord.from_journal(orjson.loads(orjson.dumps(row))).to_journal()) == (
            orjson.dumps(row)
        )


def test_numpy_prompt_ids_are_journaled_as_the_list_they_were() -> None:
    record = TurnRecord.from_journal(ROW)
    assert record.commit is not None
    record.commit.prompt_ids = np.asarray([1, 2, 3], dtype=np.int32)
    assert orjson.dumps(record.to_journal(), option=OPT) == orjson.dumps(ROW)


def test_a_row_from_before_conversations_reads_as_the_active_conversation() -> None:
    old = {k: v for k, v in ROW.items() if k not in ("conversation", "parent")}
    spec = {k: v for k, v in ROW["commit"].items() if k not in ("history", "tools", "agent_text", "surface")}
    record = TurnRecord.from_journal({**old, "commit": spec})
    assert (record.conversation, record.parent, record.segment) == (
        None,
        None,
        ("new_conversation", "a subagent"),
    )
    assert record.commit is not None
    assert (record.commit.calls, record.commit.tool_call_ids, record.commit.history) == (
        (("add", '{"a":2}'),),
        ("call_1",),
        None,
    )
    assert record.commit.version_spans == [("v7", 0, 1), ("v8", 1, 2)]
