"""Ledger gaps the mutation bench found (`bench/mutation.py`): weight-version spans that meet
merge into one, within a turn and across turns whose prompt adds nothing (a completions agent
that sends back exactly the text it was given)."""

from __future__ import annotations

from rlgw.gateway.ledger.ledger import Ledger
from rlgw.gateway.sample import VersionSpan, validate_sample
from tests.gateway.ledger.test_ledger_edges import turn


def test_adjacent_spans_of_one_version_merge() -> None:
    ledger = Ledger()
    spans = [("v1", 0, 2), ("v1", 2, 3), ("v2", 3, 4)]
    ledger.commit(turn(None, [1, 2, 3], [4, 5, 6, 7], version_spans=spans, surface="completions"), "v1")
    seg = ledger.current
    assert seg.versions == [["v1", 3, 6], ["v2", 6, 7]]
    # The next turn adds no prompt and was sampled by v2: it continues the last span.
    ledger.commit(turn(None, [], [8, 9], surface="completions", rid="rid-2"), "v2")
    assert seg.versions == [["v1", 3, 6], ["v2", 6, 9]]
    [(_, sample, _)] = ledger.build_samples(
        reward=0.0, status=None, rollout_id="r", group_index=0, metadata={}
    )
    assert sample is not None and sample.weight_versions == [VersionSpan("v1", 0, 3), VersionSpan("v2", 3, 6)]
    validate_sample(sample, 100)
