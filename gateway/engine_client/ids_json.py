"""The JSON text of each session's last engine input, so that the next turn serializes only what it adds.

A turn's `/generate` body carries the whole history's ids, and the history is the last turn's
input plus the ids since (its sampled ids and the new prompt increment). Serializing 32k ids
took ~0.3 ms of every turn at that length, growing with the history; reusing the last input's
text leaves the new ids, a hash and a copy. The text is reused only when the last input's ids
are, bit for bit, the start of this one (checked with xxh3 over the ids' bytes, about 10 us at
32k): a retry, a rewritten history or a new segment simply falls back to serializing it all.

Memory: about 6.5 bytes per cached id. The cache keeps the most recently used sessions' texts
up to `max_bytes` in all and drops the least recent beyond that (their next turn serializes
everything, as without the cache); a session that ended is dropped the same way. This module
knows ids and bytes, not sessions or HTTP.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import orjson
import xxhash

DEFAULT_MAX_BYTES = 256 << 20


@dataclass(slots=True, frozen=True)
class _Entry:
    count: int  # ids the text holds
    digest: int  # xxh3 of those ids' int32 bytes
    text: bytes  # "id,id,...,id": the array's inside, no brackets


class IdsJsonCache:
    """`encode(key, ids)` gives the inside of `orjson.dumps(ids)`, reusing the key's last text."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0
        self.reused = 0  # ids whose text came from the cache (for tests and benchmarks)

    def encode(self, key: str, ids: np.ndarray) -> bytes:
        """`orjson.dumps(ids)` without its brackets, for a 1-D contiguous int32 array `ids`."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= len(entry.text)
        n = len(ids)
        hasher = xxhash.xxh3_64()
        start, known = 0, b""
        if entry is not None and 0 < entry.count <= n:
            hasher.update(ids[: entry.count])
            if hasher.intdigest() == entry.digest:
                start, known = entry.count, entry.text
            else:
                hasher.reset()
        rest = orjson.dumps(ids[start:], option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
        text = known + b"," + rest if known and rest else known or rest
        self.reused += start
        if len(text) <= self.max_bytes:
            hasher.update(ids[start:])  # one pass over the ids in all: the digest of the whole
            self._entries[key] = _Entry(n, hasher.intdigest(), text)
            self._bytes += len(text)
            while self._bytes > self.max_bytes:
                self._bytes -= len(self._entries.popitem(last=False)[1].text)
        return text

    @property
    def size(self) -> int:
        """Bytes of text held."""
        return self._bytes
