"""The prefix cache's tree on its own: exact KV back for every prefix, divergence, LRU eviction,
the epoch that invalidates. KV tensors here encode (token id, position, layer), so a slice or a
concatenation that picks the wrong columns shows up as a wrong value."""

from __future__ import annotations

import pytest
import torch

from rlgw.engine.prefix_cache import PrefixCache

LAYERS = 2
# Per token: LAYERS x (k, v) x 2 heads x 4 dims x 4 bytes.
TOKEN_BYTES = LAYERS * 2 * 2 * 4 * 4


def kv_of(ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """What a model would compute for `ids`: every value names its token, position and layer."""
    pos = torch.arange(len(ids), dtype=torch.float32)
    tok = torch.tensor(ids, dtype=torch.float32) * 1000 + pos
    t = tok.view(1, 1, -1, 1).expand(1, 2, -1, 4).contiguous()
    return [(t + 0.25 * layer, -t - 0.25 * layer) for layer in range(LAYERS)]


def assert_kv(got, ids: list[int]) -> None:
    want = kv_of(ids)
    assert len(got) == len(want)
    for (gk, gv), (wk, wv) in zip(got, want, strict=True):
        assert torch.equal(gk, wk) and torch.equal(gv, wv)


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_a_longer_request_reuses_the_stored_prefix() -> None:
    cache = PrefixCache(1 << 20)
    a = seq(1, 10)
    cache.insert(a, kv_of(a), cache.epoch)
    hit = cache.match([*a, 99, 98], limit=11)
    assert hit is not None and hit.length == 10
    assert_kv(hit.kv, a)
    capped = cache.match(a, limit=7)  # the caller keeps the last tokens to compute
    assert capped is not None and capped.length == 7
    assert_kv(capped.kv, a[:7])
    assert cache.match([5, 6, 7], limit=2) is None  # no stored sequence starts with 5


def test_a_diverging_request_reuses_only_the_shared_part() -> None:
    cache = PrefixCache(1 << 20)
    a = seq(1, 10)
    b = [*a[:6], 500, 501, 502, 503]
    cache.insert(a, kv_of(a), cache.epoch)
    hit = cache.match(b, limit=len(b) - 1)
    assert hit is not None and hit.length == 6
    assert_kv(hit.kv, a[:6])
    # Storing b splits a's edge; both come back whole and exact, the shared part held once.
    cache.insert(b, kv_of(b), cache.epoch)
    assert cache.stats()["cached_tokens"] == 10 + 4
    assert cache.stats()["cached_bytes"] == 14 * TOKEN_BYTES
    for ids in (a, b):
        hit = cache.match([*ids, 7], limit=len(ids))
        assert hit is not None and hit.length == len(ids)
        assert_kv(hit.kv, ids)


def test_a_growing_history_is_stored_once_and_comes_back_whole() -> None:
    cache = PrefixCache(1 << 20)
    history: list[int] = []
    for turn in range(5):
        history = history + seq(100 * (turn + 1), 7)
        hit = cache.match(history, limit=len(history) - 1)
        assert (hit.length if hit else 0) == (len(history) - 7 if turn else 0)
        cache.insert(history, kv_of(history), cache.epoch)
    assert cache.stats()["cached_tokens"] == len(history)
    hit = cache.match([*history, 1], limit=len(history))
    assert hit is not None
    assert_kv(hit.kv, history)


def test_stored_tensors_are_copies_not_views_of_the_callers() -> None:
    cache = PrefixCache(1 << 20)
    a = seq(1, 5)
    kv = kv_of(a)
    cache.insert(a, kv, cache.epoch)
    for k, v in kv:  # the caller's batch tensors are reused or freed after a request ends
        k.zero_()
        v.zero_()
    hit = cache.match([*a, 9], limit=5)
    assert hit is not None
    assert_kv(hit.kv, a)


def test_least_recently_used_leaves_are_evicted_first() -> None:
    cache = PrefixCache(25 * TOKEN_BYTES)
    a, b, c = seq(1, 10), seq(1000, 10), seq(2000, 10)
    cache.insert(a, kv_of(a), cache.epoch)
    cache.insert(b, kv_of(b), cache.epoch)
    assert cache.match([*a, 1], limit=10) is not None  # a is now more recent than b
    cache.insert(c, kv_of(c), cache.epoch)
    stats = cache.stats()
    assert stats["cached_bytes"] <= 25 * TOKEN_BYTES and stats["evicted_tokens"] == 10
    assert cache.match([*b, 1], limit=10) is None
    for ids in (a, c):
        hit = cache.match([*ids, 1], limit=10)
        assert hit is not None
        assert_kv(hit.kv, ids)


def test_eviction_goes_leaf_first_along_a_shared_prefix() -> None:
    cache = PrefixCache(16 * TOKEN_BYTES)
    stem = seq(1, 8)
    a, b = stem + seq(100, 4), stem + seq(200, 4)
    cache.insert(a, kv_of(a), cache.epoch)
    cache.insert(b, kv_of(b), cache.epoch)  # stem 8 + 4 + 4 = 16: fits
    assert cache.stats()["cached_tokens"] == 16
    c = seq(300, 4)
    cache.insert(c, kv_of(c), cache.epoch)  # 20 > 16: a's leaf (least recent) goes, the stem stays
    assert cache.stats()["cached_tokens"] == 16
    hit = cache.match(a, limit=len(a) - 1)
    assert hit is not None and hit.length == 8
    assert_kv(hit.kv, stem)


def test_a_sequence_larger_than_the_budget_is_not_kept() -> None:
    cache = PrefixCache(5 * TOKEN_BYTES)
    a = seq(1, 10)
    cache.insert(a, kv_of(a), cache.epoch)
    assert cache.stats()["cached_bytes"] == 0
    assert cache.match(a, limit=9) is None


def test_clear_drops_everything_and_refuses_kv_begun_before_it() -> None:
    cache = PrefixCache(1 << 20)
    a, b = seq(1, 10), seq(50, 10)
    cache.insert(a, kv_of(a), cache.epoch)
    began = cache.epoch  # b's computation began here, then the weights changed
    cache.clear()
    assert cache.stats()["cached_tokens"] == 0 and cache.match(a, limit=9) is None
    cache.insert(b, kv_of(b), began)
    assert cache.stats()["cached_tokens"] == 0
    cache.insert(b, kv_of(b), cache.epoch)
    assert cache.stats()["cached_tokens"] == 10


def test_a_zero_budget_turns_the_cache_off() -> None:
    cache = PrefixCache(0)
    a = seq(1, 10)
    cache.insert(a, kv_of(a), cache.epoch)
    assert not cache.enabled and cache.match(a, limit=9) is None


def test_kv_that_does_not_cover_the_ids_is_refused() -> None:
    cache = PrefixCache(1 << 20)
    with pytest.raises(ValueError, match="covers 9 tokens"):
        cache.insert(seq(1, 10), kv_of(seq(1, 9)), cache.epoch)
