"""The ledger's routed experts: each turn's rows continue the segment's (one row per fed position),
a retried turn's rows are rolled back with it, a turn without routing leaves the segment without
any (and says so), and the journal row carries them compactly and reads them back."""

from __future__ import annotations

import numpy as np
import orjson

from rlgw.gateway.ledger.ledger import Ledger, TurnCommit, routed_from
from rlgw.gateway.ledger.record import TurnRecord

LAYERS, TOP_K = 2, 2


def rows(first: int, count: int) -> np.ndarray:
    """Distinct routing per position: position p routes to experts (p % 7, p % 5) in every layer."""
    p = np.arange(first, first + count)
    return np.stack([p % 7, p % 5], axis=1)[:, None, :].repeat(LAYERS, axis=1).astype(np.uint8)


def turn(prompt: list[int], out: list[int], routed: np.ndarray | None, rid: str = "r") -> TurnCommit:
    return TurnCommit(
        new_messages=None,
        prompt_ids=prompt,
        output_ids=out,
        logprobs=[-0.5] * len(out),
        version_spans=[],
        response_id="cmpl-" + rid,
        tool_call_ids=(),
        content="",
        rid=rid,
        finish_type="stop",
        ended_with_stop_token=True,
        parse_errors=[],
        routed_experts=routed,
    )


def commit(ledger: Ledger, prompt: list[int], out: list[int], routed: bool = True, rid: str = "r") -> None:
    seg = ledger.current
    start = routed_from(len(seg.ids) + len(prompt), len(prompt))
    count = len(seg.ids) + len(prompt) + len(out) - 1 - start
    ledger.commit(turn(prompt, out, rows(start, count) if routed else None, rid), "v1")


def sample_routing(ledger: Ledger) -> tuple[np.ndarray | None, dict]:
    ((_, s, _),) = ledger.build_samples(reward=1.0, status=None, rollout_id="x", group_index=0, metadata={})
    return s.rollout_routed_experts, s.metadata


def test_turns_continue_the_segment_and_a_retry_rolls_its_rows_back() -> None:
    ledger = Ledger()
    commit(ledger, [1, 2, 3], [4, 5])
    commit(ledger, [6, 7], [8, 9, 10], rid="a")
    ledger.rollback_last_turn()
    commit(ledger, [6, 7], [11], rid="b")
    commit(ledger, [12], [13, 14])
    got, _ = sample_routing(ledger)
    assert np.array_equal(got, rows(0, len(ledger.current.ids) - 1))


def test_a_turn_without_routing_leaves_the_segment_without() -> None:
    ledger = Ledger()
    commit(ledger, [1, 2, 3], [4, 5])
    commit(ledger, [6, 7], [8], routed=False)
    commit(ledger, [9], [10])
    got, meta = sample_routing(ledger)
    assert got is None and meta["routed_experts_lost"] == [{"turn": 1}]


def test_journal_row_keeps_routing_compact_and_reads_it_back() -> None:
    routed = rows(0, 9)
    record = TurnRecord(version="v1", commit=turn([1, 2, 3, 4, 5], [6, 7, 8, 9, 10], routed))
    row = orjson.loads(orjson.dumps(record.to_journal(), option=orjson.OPT_SERIALIZE_NUMPY))
    assert isinstance(row["commit"]["routed_experts"]["data"], str)  # base64, not a JSON list
    back = TurnRecord.from_journal(row).commit.routed_experts
    assert back.dtype == np.uint8 and np.array_equal(back, routed)
