"""The prefix cache: the KV of finished requests in a radix tree keyed by token ids, LRU-bounded.

Owns the tree, its byte budget and its invalidation epoch. A request whose sequence starts with
tokens some finished request already computed gets that prefix's keys and values (`match`) and
prefills only the rest; a request that finishes normally hands its KV back (`insert`), which stores
only the tokens the tree does not hold yet. Knows nothing about requests, models or scheduling: the
runner asks for a match when a prefill starts, the engine inserts when a request ends and clears the
tree on every weight update and flush.

Why a radix tree over token ids rather than one entry per routing key (`X-SMG-Routing-Key`): the
tree needs no header (the engine serves raw `/generate` callers too), stores a prefix shared by many
sessions once (a GRPO group's n samples of one prompt, a system prompt every session starts with),
and a turn that diverges inside a cached history (a retried or edited turn) still reuses the shared
part. Its cost is one concatenation of the matched segments per hit (one copy of the prefix's KV),
which is what the per-key variant pays too, since the model appends to the cache by concatenation.

Correctness rules:
- An edge's tensors are never written in place: a hit hands out slices or a fresh concatenation,
  and `DynamicCache` grows by `torch.cat`, so a running request cannot corrupt what is stored.
- `clear()` bumps the epoch; `insert` drops KV whose computation began under an older epoch, so a
  request that straddles a weight update (paused in place) never stores old-weight KV.
- Only what `insert` is given is stored, so the engine inserts finished (stop/length) requests only:
  an aborted or failed request leaves nothing.
- Eviction removes least-recently-used leaves until the stored bytes fit the budget; an evicted
  parent's children are gone first, so every stored node's whole path is present.

Thread safety: every method takes the cache's own lock (the engine thread matches and inserts; HTTP
threads clear).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from dataclasses import dataclass, field

import torch

# Per layer: keys and values, each [1, kv_heads, tokens, head_dim].
KV = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(eq=False, slots=True)
class _Node:
    """An edge of the tree: its token ids and their KV; the root has neither."""

    ids: list[int]
    kv: KV
    parent: _Node | None
    children: dict[int, _Node] = field(default_factory=dict)
    last_used: int = 0
    nbytes: int = 0


def _nbytes(kv: KV) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


def _slice(kv: KV, lo: int, hi: int | None = None, clone: bool = False) -> KV:
    out = [(k[:, :, lo:hi], v[:, :, lo:hi]) for k, v in kv]
    return [(k.clone(), v.clone()) for k, v in out] if clone else out


def _common(a: list[int], b: list[int], start: int) -> int:
    """Length of the common prefix of `a` and `b[start:]`."""
    n = min(len(a), len(b) - start)
    if a[:n] == b[start : start + n]:
        return n
    return next(i for i in range(n) if a[i] != b[start + i])


@dataclass(frozen=True, slots=True)
class Match:
    """A hit: the first `length` tokens' KV (per layer, ready for a request's own cache)."""

    length: int
    kv: KV


class PrefixCache:
    """KV of finished requests keyed by token prefix; `max_bytes` 0 disables it.

    Trade-offs: a hit copies the matched prefix's KV once (concatenating its segments); storage is
    per edge, so a history that grew turn by turn is held once, not once per turn.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._root = _Node(ids=[], kv=[], parent=None)
        self._tick = itertools.count(1)
        self._epoch = 0
        self._bytes = 0
        self._tokens = 0
        self.hits = 0
        self.lookups = 0
        self.evicted_tokens = 0

    @property
    def enabled(self) -> bool:
        """True when the budget allows storing anything."""
        return self.max_bytes > 0

    @property
    def epoch(self) -> int:
        """Bumped by every `clear`; a request records it when its KV computation begins."""
        return self._epoch

    def stats(self) -> dict[str, int]:
        """Stored tokens and bytes, the budget, lookups and hits since start."""
        with self._lock:
            return {
                "cached_tokens": self._tokens,
                "cached_bytes": self._bytes,
                "max_bytes": self.max_bytes,
                "lookups": self.lookups,
                "hits": self.hits,
                "evicted_tokens": self.evicted_tokens,
            }

    def match(self, ids: list[int], limit: int) -> Match | None:
        """The longest stored prefix of `ids`, at most `limit` tokens long (None when nothing matches)."""
        if not self.enabled or limit <= 0:
            return None
        with self._lock:
            self.lookups += 1
            node, pos, parts = self._root, 0, []
            tick = next(self._tick)
            while pos < limit and (child := node.children.get(ids[pos])) is not None:
                n = min(_common(child.ids, ids, pos), limit - pos)
                child.last_used = tick
                parts.append(child.kv if n == len(child.ids) else _slice(child.kv, 0, n))
                pos += n
                if n < len(child.ids):
                    break
                node = child
            if not pos:
                return None
            self.hits += 1
        if len(parts) == 1:
            return Match(pos, parts[0])
        layers = zip(*parts, strict=True)
        kv = [
            (torch.cat([k for k, _ in seg], dim=2), torch.cat([v for _, v in seg], dim=2)) for seg in layers
        ]
        return Match(pos, kv)

    def insert(self, ids: list[int], kv: KV, epoch: int) -> None:
        """Store the KV of `ids` (`kv` covers exactly those tokens; only the new part is copied).

        Ignored when `epoch` is not the current one (the KV began before a weight update or flush).
        """
        if not self.enabled or not ids:
            return
        if kv[0][0].shape[2] != len(ids):
            raise ValueError(f"KV covers {kv[0][0].shape[2]} tokens, the ids {len(ids)}")
        with self._lock:
            if epoch != self._epoch:
                return
            tick = next(self._tick)
            node, pos = self._root, 0
            while pos < len(ids):
                child = node.children.get(ids[pos])
                if child is None:
                    leaf = _Node(ids=ids[pos:], kv=_slice(kv, pos, clone=True), parent=node, last_used=tick)
                    leaf.nbytes = _nbytes(leaf.kv)
                    node.children[ids[pos]] = leaf
                    self._bytes += leaf.nbytes
                    self._tokens += len(leaf.ids)
                    break
                n = _common(child.ids, ids, pos)
                if n < len(child.ids):
                    child = self._split(child, n)
                child.last_used = tick
                node, pos = child, pos + n
            self._evict()

    def _split(self, child: _Node, n: int) -> _Node:
        """Cut `child`'s edge after `n` tokens; returns the new upper node (both halves own copies)."""
        upper = _Node(ids=child.ids[:n], kv=_slice(child.kv, 0, n, clone=True), parent=child.parent)
        upper.last_used = child.last_used
        upper.nbytes = _nbytes(upper.kv)
        child.parent.children[upper.ids[0]] = upper
        child.ids, child.kv, child.parent = child.ids[n:], _slice(child.kv, n, clone=True), upper
        self._bytes += upper.nbytes + _nbytes(child.kv) - child.nbytes
        child.nbytes = _nbytes(child.kv)
        upper.children[child.ids[0]] = child
        return upper

    def _evict(self) -> None:
        """Drop least-recently-used leaves until the stored bytes fit the budget (lock held)."""
        if self._bytes <= self.max_bytes:
            return
        heap = [(n.last_used, id(n), n) for n in self._nodes() if not n.children]
        heapq.heapify(heap)
        while self._bytes > self.max_bytes and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.ids[0]]
            self._bytes -= leaf.nbytes
            self._tokens -= len(leaf.ids)
            self.evicted_tokens += len(leaf.ids)
            if parent is not self._root and not parent.children:
                heapq.heappush(heap, (parent.last_used, id(parent), parent))

    def _nodes(self):
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            yield node

    def clear(self) -> None:
        """Drop everything and start a new epoch (weights changed, or a flush was asked for)."""
        with self._lock:
            self._root = _Node(ids=[], kv=[], parent=None)
            self._bytes = self._tokens = 0
            self._epoch += 1
