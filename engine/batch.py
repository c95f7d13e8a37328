"""The running batch's KV cache: one left-padded `DynamicCache` shared by the decoding requests.

Owns the tensor bookkeeping of batched decode: joining a request's own prefill cache into the batch
(left-padding the shorter side), dropping finished rows, trimming columns that became padding in
every row, and the attention mask that goes with it. Knows nothing about scheduling or sampling.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rlgw.engine.request import Request


class BatchCache:
    """The running requests' shared, left-padded KV cache.

    The `DynamicCache` object persists across decode steps (the model appends to it in place); its
    tensors are re-sliced or re-padded only when a request joins or leaves.
    """

    def __init__(self) -> None:
        self.reqs: list[Request] = []
        self.cache = None  # DynamicCache of [B, heads, T, head_dim] per layer
        self.mask = torch.zeros((0, 0), dtype=torch.long)
        self.padded = False  # some row has left padding: the forward needs the mask

    def __len__(self) -> int:
        return len(self.reqs)

    def add(self, req: Request) -> None:
        """Left-pad `req`'s own prefill cache (`req.kv`, consumed) into the batch."""
        cache, req.kv = req.kv, None
        if cache is None:
            raise RuntimeError(f"request {req.rid} joined the batch without a cache")
        new_len = cache.get_seq_length()
        if not self.reqs:
            self.reqs, self.cache = [req], cache
            self.mask = torch.ones((1, new_len), dtype=torch.long)
            return
        width = max(self.mask.shape[1], new_len)
        for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
            mine.keys = _cat_padded(mine.keys, theirs.keys, width)
            mine.values = _cat_padded(mine.values, theirs.values, width)
        self.mask = _cat_padded(self.mask, torch.ones((1, new_len), dtype=torch.long), width, dim=1)
        self.padded = bool((self.mask == 0).any())
        self.reqs.append(req)

    def keep(self, keep_rows: list[int]) -> None:
        """Keep only `keep_rows`, trimming leading columns that are padding in every kept row."""
        if len(keep_rows) == len(self.reqs):
            return
        if not keep_rows:
            self.__init__()
            return
        index = torch.tensor(keep_rows, dtype=torch.long)
        mask = self.mask.index_select(0, index)
        first = int(mask.any(dim=0).to(torch.int8).argmax())
        self.mask = mask[:, first:]
        self.padded = bool((self.mask == 0).any())
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, first:]
            layer.values = layer.values.index_select(0, index)[:, :, first:]
        self.reqs = [self.reqs[i] for i in keep_rows]

    def row_kv(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row `row`'s keys and values without its left padding (views into the batch's tensors)."""
        n = int(self.mask[row].sum())
        return [
            (layer.keys[row : row + 1, :, -n:], layer.values[row : row + 1, :, -n:])
            for layer in self.cache.layers
        ]


def _cat_padded(a: torch.Tensor, b: torch.Tensor, width: int, dim: int = 2) -> torch.Tensor:
    """Concatenate along the batch dim after left-padding `a` and `b` with zeros to `width` on `dim`."""

    def pad(t: torch.Tensor) -> torch.Tensor:
        missing = width - t.shape[dim]
        if missing == 0:
            return t
        shape = list(t.shape)
        shape[dim] = missing
        return torch.cat([torch.zeros(shape, dtype=t.dtype), t], dim=dim)

    return torch.cat([pad(a), pad(b)], dim=0)


def new_cache(kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None):
    """A `DynamicCache` (full-attention layers) for one request's prefill, empty or holding `kv`.

    `kv`'s tensors are adopted, not copied: the model grows a `DynamicLayer` by concatenation, so
    they are never written in place.
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache()
    for k, v in kv or ():
        layer = DynamicLayer()
        layer.lazy_initialization(k, v)
        layer.keys, layer.values = k, v
        cache.layers.append(layer)
    return cache


def cache_kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The per-layer keys and values of a one-row `DynamicCache`."""
    return [(layer.keys, layer.values) for layer in cache.layers]
