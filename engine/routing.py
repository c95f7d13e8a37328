"""Routed experts: which experts each token went to in each MoE layer, as SGLang reports them.

Owns the capture (a forward hook on every MoE layer's top-k router, armed only around the forward
passes of requests that asked for it), a request's rows (one per sequence position in
`[routed_experts_start_len, seqlen - 1)`: the last sampled token is never fed forward) and their
wire form. SGLang (`--enable-return-routed-experts`, `return_routed_experts` on `/generate`)
returns them once a request finishes, in `meta_info["routed_experts"]`: base64 of a C-order
little-endian int32 array shaped [rows, num_hidden_layers, num_experts_per_tok], dense layers' rows
zero. The embedded engine returns the same field, shape and encoding.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from rlgw.engine.request import Request


def moe_routers(decoder: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """Each MoE layer's top-k router by layer index (`layer.mlp.gate` with a `top_k`; empty: dense)."""
    routers = {}
    for i, layer in enumerate(getattr(decoder, "layers", ())):
        gate = getattr(getattr(layer, "mlp", None), "gate", None)
        if gate is not None and hasattr(gate, "top_k") and hasattr(gate, "num_experts"):
            routers[i] = gate
    return routers


class RoutingCapture:
    """Records the routers' top-k expert ids of one forward pass, batched (one tensor per layer)."""

    def __init__(self, decoder: torch.nn.Module) -> None:
        self.routers = moe_routers(decoder)
        self.num_layers = len(getattr(decoder, "layers", ()))
        self.top_k = int(next(iter(self.routers.values())).top_k) if self.routers else 0
        self._armed = False
        self._ids: dict[int, torch.Tensor] = {}
        for i, gate in self.routers.items():
            gate.register_forward_hook(self._hook(i))

    @property
    def is_moe(self) -> bool:
        """True when the model has at least one MoE layer."""
        return bool(self.routers)

    def _hook(self, layer: int):
        def keep(_module, _inputs, out) -> None:
            # transformers' routers return (logits, weights, indices); indices are [rows, top_k].
            if self._armed:
                self._ids[layer] = out[-1]

        return keep

    @contextmanager
    def capture(self, enabled: bool) -> Iterator[list[torch.Tensor]]:
        """Arm the hooks for the forward inside; the yielded list then holds [rows, layers, top_k] int32."""
        result: list[torch.Tensor] = []
        if not enabled or not self.routers:
            yield result
            return
        self._armed, self._ids = True, {}
        try:
            yield result
        finally:
            self._armed = False
        rows = next(iter(self._ids.values())).shape[0] if self._ids else 0
        table = torch.zeros((rows, self.num_layers, self.top_k), dtype=torch.int32)
        for layer, ids in self._ids.items():
            table[:, layer] = ids.to(torch.int32)
        self._ids = {}
        result.append(table)


def routing_floor(req: Request) -> int | None:
    """The first position whose routing `req` still needs computed (None: it asked for none).

    The prefix cache may serve the KV before it, never after: a cached prefix carries no routing.
    """
    if not req.return_routed_experts:
        return None
    return req.routed_experts_start_len + req.routed_rows


def keep_rows(req: Request, first: int, rows: torch.Tensor) -> None:
    """Store `rows`, the routing of positions `first ..`, as `req`'s rows from `routed_experts_start_len`.

    Positions before the start are dropped; a re-fed position (a retracted request's re-prefill)
    replaces what was there. Appending is one list append: no copy of what came before.
    """
    start = req.routed_experts_start_len
    skip = max(0, start - first)
    if skip >= rows.shape[0]:
        return
    rows = rows[skip:].clone()
    at = first + skip - start
    if at < req.routed_rows:
        req.routed_experts = [torch.cat(req.routed_experts)[:at]]
        req.routed_rows = at
    req.routed_experts.append(rows)
    req.routed_rows += rows.shape[0]


def routed_rows(req: Request) -> torch.Tensor | None:
    """`req`'s routing as one int32 [rows, layers, top_k] tensor (None: not asked, or a dense model)."""
    if not req.routed_experts:
        return None
    return torch.cat(req.routed_experts)


def encode_rows(rows: torch.Tensor) -> str:
    """SGLang's wire form: base64 of the little-endian int32 C-order bytes."""
    return base64.b64encode(rows.to(torch.int32).contiguous().numpy().astype("<i4").tobytes()).decode("ascii")
