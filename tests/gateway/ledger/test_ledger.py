"""The ledger's sync/commit rules, on hand-made turns (no engine, no template)."""

from __future__ import annotations

import numpy as np

from rlgw.gateway.ledger.ledger import Ledger, TurnCommit, Violation
from rlgw.gateway.sample import SampleStatus, validate_sample

SYSTEM = {"role": "system", "content": "You are terse."}
USER = {"role": "user", "content": "Weather in Paris?"}


def _commit(ledger: Ledger, new, prompt, out, *, calls=(), content="", version="v1", stop=True, rid="r"):
    return ledger.commit(
        TurnCommit(
            new_messages=new,
            prompt_ids=prompt,
            output_ids=out,
            logprobs=[-0.5] * len(out),
            version_spans=[],
            response_id="chatcmpl-" + rid,
            tool_call_ids=tuple(calls),
            content=content,
            rid=rid,
            finish_type="stop",
            ended_with_stop_token=stop,
            parse_errors=[],
        ),
        version,
    )


def _assistant_call(call_id: str, args: str) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": args}}
        ],
    }


def test_append_then_echo_with_reserialized_arguments_is_not_a_fork() -> None:
    ledger = Ledger()
    msgs = [SYSTEM, USER]
    assert ledger.sync(msgs).new == msgs
    _commit(ledger, msgs, [1, 2, 3], [10, 11, 12], calls=["call_a"])
    # The agent echoes the call with its own JSON formatting and appends the tool result.
    tool = {"role": "tool", "tool_call_id": "call_a", "content": "sunny"}
    history = [SYSTEM, USER, _assistant_call("call_a", '{ "city" : "Paris" }'), tool]
    assert ledger.sync(history).new == [tool]


def test_plain_answer_matches_by_content_and_reasoning_is_not_compared() -> None:
    ledger = Ledger()
    _commit(ledger, [USER], [1, 2], [5, 6, 7], content="It is sunny.")
    echoed = {"role": "assistant", "content": "It is sunny.\n", "reasoning_content": None}
    follow = {"role": "user", "content": "Thanks"}
    assert ledger.sync([USER, echoed, follow]).new == [follow]
    changed = {"role": "assistant", "content": "Something else"}
    v = ledger.sync([USER, changed, follow])
    assert isinstance(v, Violation) and v.cause == "rewrite" and v.index == 1


def test_shrunk_and_rewritten_history_are_violations() -> None:
    ledger = Ledger()
    _commit(ledger, [SYSTEM, USER], [1, 2], [3], content="x")
    v = ledger.sync([SYSTEM])
    assert isinstance(v, Violation) and v.cause == "truncation"
    v = ledger.sync([{"role": "system", "content": "SUMMARY"}, USER, {"role": "assistant", "content": "x"}])
    assert isinstance(v, Violation) and v.index == 0
    # Wrong tool-call id on the echoed assistant turn.
    ledger2 = Ledger()
    _commit(ledger2, [USER], [1], [2], calls=["call_a"])
    v = ledger2.sync([USER, _assistant_call("call_zzz", "{}")])
    assert isinstance(v, Violation) and v.index == 1


def test_null_fields_added_on_resend_are_not_rewrites() -> None:
    ledger = Ledger()
    _commit(ledger, [USER], [1], [2], content="ok")
    resent = {**USER, "name": None}
    assert ledger.sync([resent, {"role": "assistant", "content": "ok"}, USER]).new == [USER]


def test_retry_of_the_last_request_rolls_the_turn_back() -> None:
    ledger = Ledger()
    _commit(ledger, [USER], [1, 2], [3, 4], content="a", rid="r1")
    tool_turn = [USER, {"role": "assistant", "content": "a"}, {"role": "user", "content": "more"}]
    _commit(ledger, [tool_turn[2]], [7, 8], [9], content="b", rid="r2", version="v2")
    assert list(ledger.current.ids) == [1, 2, 3, 4, 7, 8, 9]
    assert ledger.is_retry(tool_turn)
    assert not ledger.is_retry([USER])
    ledger.rollback_last_turn()
    assert list(ledger.current.ids) == [1, 2, 3, 4]
    assert len(ledger.current.turns) == 1 and ledger.current.versions == [["v1", 2, 4]]
    assert ledger.sync(tool_turn).new == [tool_turn[2]]


def test_samples_mask_logprobs_and_version_spans() -> None:
    ledger = Ledger()
    _commit(ledger, [USER], [100, 101, 102], [1, 2, 3], content="a", version="v1")
    _commit(ledger, [], [200, 201], [4, 5], content="b", version="v2")
    [(index, sample, _)] = ledger.build_samples(
        reward=1.0, status=SampleStatus.COMPLETED, rollout_id="ro", group_index=2, metadata={"task": "t"}
    )
    assert index == 0 and sample is not None
    assert sample.tokens.tolist() == [100, 101, 102, 1, 2, 3, 200, 201, 4, 5]
    assert sample.response_length == 7
    assert sample.loss_mask.tolist() == [1, 1, 1, 0, 0, 1, 1]
    np.testing.assert_allclose(sample.rollout_log_probs, [-0.5, -0.5, -0.5, 0, 0, -0.5, -0.5])
    spans = [(s.version, s.start, s.end) for s in sample.weight_versions]
    assert spans == [("v1", 0, 5), ("v2", 5, 7)]
    assert sample.metadata["engine_rids"] == ["r", "r"] and sample.metadata["task"] == "t"
    validate_sample(sample, vocab_size=1000)


def test_new_segment_starts_a_separate_sample() -> None:
    ledger = Ledger()
    _commit(ledger, [USER], [1], [2], content="a")
    ledger.new_segment("history rewritten at message 0")
    _commit(ledger, [USER], [1, 9], [3, 4], content="b")
    built = ledger.build_samples(
        reward=0.0, status=SampleStatus.COMPLETED, rollout_id="ro", group_index=0, metadata={}
    )
    assert [b[0] for b in built] == [0, 1]
    assert built[1][1].metadata["segment_cause"] == "history rewritten at message 0"
    assert built[1][1].tokens.tolist() == [1, 9, 3, 4]
