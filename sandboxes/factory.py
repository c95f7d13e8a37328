"""Build sandboxes from a small, picklable spec (so Ray workers can build their own).

`SandboxSpec("local")` gives a `LocalSandbox`; `SandboxSpec("rock", {...})` a `RockSandbox`
with `RockConfig.from_env(**options)`. This module owns only the name-to-backend mapping.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rlgw.sandboxes.base import Sandbox

SandboxKind = Literal["local", "rock"]


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """Which backend, and its options (keyword arguments of the backend or its config)."""

    kind: SandboxKind = "local"
    options: dict[str, Any] = field(default_factory=dict)

    def create(self) -> Sandbox:
        """A new, unstarted sandbox."""
        if self.kind == "local":
            from rlgw.sandboxes.local import LocalSandbox

            return LocalSandbox(**self.options)
        if self.kind == "rock":
            from rlgw.sandboxes.rock import RockConfig, RockSandbox

            return RockSandbox(RockConfig.from_env(**self.options))
        raise ValueError(f"unknown sandbox kind {self.kind!r} (expected 'local' or 'rock')")
