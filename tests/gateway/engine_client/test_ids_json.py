"""The engine body's ids reuse the last turn's JSON text only when the last ids start this turn's."""

from __future__ import annotations

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from rlgw.gateway.engine_client.backend import SGLangBackend
from rlgw.gateway.engine_client.ids_json import IdsJsonCache

ID = st.integers(min_value=0, max_value=2**31 - 1)
# What the next call of a session sends, relative to its last one.
STEP = st.one_of(
    st.tuples(st.just("extend"), st.lists(ID, max_size=40)),  # a turn: output ids and an increment
    st.tuples(st.just("truncate"), st.integers(0, 60)),  # a retry or a shorter history
    st.tuples(st.just("rewrite"), st.integers(0, 60), ID),  # one id changed somewhere
    st.tuples(st.just("other_key"), st.lists(ID, max_size=40)),  # another session in between
)


def _json(ids: np.ndarray) -> bytes:
    return orjson.dumps(ids, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]


@settings(max_examples=300, deadline=None)
@given(st.lists(ID, max_size=60), st.lists(STEP, max_size=25), st.integers(1, 4000))
def test_the_text_is_always_orjsons_and_reused_only_for_an_extension(
    first: list[int], steps: list, max_bytes: int
) -> None:
    cache = IdsJsonCache(max_bytes)
    ids = np.array(first, dtype=np.int32)
    assert cache.encode("s", ids) == _json(ids)
    for step in steps:
        before, last = cache.reused, ids
        if step[0] == "extend":
            ids = np.concatenate([ids, np.array(step[1], dtype=np.int32)])
        elif step[0] == "truncate":
            ids = ids[: step[1]].copy()
        elif step[0] == "rewrite":
            ids = ids.copy()
            if len(ids):
                ids[step[1] % len(ids)] = step[2]
        else:
            other = np.array(step[1], dtype=np.int32)
            assert cache.encode("other", other) == _json(other)
            continue
        assert cache.encode("s", ids) == _json(ids)
        gained = cache.reused - before
        assert gained in (0, len(last))
        if gained:  # reused: the last ids really are the start of these
            assert np.array_equal(ids[: len(last)], last)
        assert cache.size <= max_bytes


def test_a_growing_session_reuses_its_text_and_the_least_recent_session_is_dropped() -> None:
    cache = IdsJsonCache(max_bytes=2500)
    rng = np.random.default_rng(0)
    a = rng.integers(0, 151_000, 100, dtype=np.int32)
    cache.encode("a", a)
    a2 = np.concatenate([a, rng.integers(0, 151_000, 50, dtype=np.int32)])
    assert cache.encode("a", a2) == _json(a2) and cache.reused == 100
    b = rng.integers(0, 151_000, 300, dtype=np.int32)  # 1.9 KB: with "a" (0.9 KB) over the cap
    cache.encode("b", b)
    assert cache.size <= 2500
    cache.encode("a", np.concatenate([a2, a2[:3]]))
    assert cache.reused == 100  # "a" was dropped: serialized whole again, still right


def test_the_engine_body_is_orjsons_for_every_kind_of_ids() -> None:
    backend = SGLangBackend("http://127.0.0.1:9")
    sampling = {"temperature": 0.7, "max_new_tokens": 16, "top_logprobs_num": 2}
    first = np.arange(5000, 5100, dtype=np.int32)
    grown = np.concatenate([first, np.arange(7, dtype=np.int32)])
    for ids in (first, grown, list(range(40)), np.arange(30, dtype=np.int64), np.zeros(0, dtype=np.int32)):
        body, top = backend._payload(ids, sampling, "rid-1", False, "s-1")
        want = {
            "input_ids": ids,
            "sampling_params": {"temperature": 0.7, "max_new_tokens": 16},
            "rid": "rid-1",
            "return_logprob": True,
            "stream": False,
            "top_logprobs_num": 2,
        }
        assert body == orjson.dumps(want, option=orjson.OPT_SERIALIZE_NUMPY)
        assert top == 2
    assert backend._ids_json.reused == len(first)  # the grown turn reused the first one's text
