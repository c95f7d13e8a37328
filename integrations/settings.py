"""What every adapter is told: which gateway, and how to run a task (one settings shape, three trainers).

Each trainer hands its settings over differently (slime: `rlgw_*` attributes from
`--custom-config-path`; verl: the agent loop's config; SkyRL: the generator's arguments), so each
adapter builds `RlgwSettings` from a mapping, with `RLGW_*` environment variables as the fallback.

`runner` picks the task runner:
- `scaffold:NAME`: an installed rlgw scaffold (`rlgw-mini`, `terminus-2`, `openhands`) on the
  sample's task document, graded by the task's verifier;
- `chat`: `ChatLoop` on the sample's prompt, graded by `reward` (a dotted path to a
  `RewardFunction`);
- `package.module:attr`: your own `AgentFunction` (or a `ChatLoop` you built with tools and
  handlers), given the session's base URL and key.
This module owns parsing those settings; running is `rollout`'s.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rlgw.integrations.rollout import AgentRunner, ChatLoop, ScaffoldRunner, TaskRunner


class SettingsError(ValueError):
    """The adapter's rlgw settings are missing or wrong; the message names the setting."""


def load_object(path: str) -> Any:
    """`package.module:attr` (or `package.module.attr`) imported."""
    module, sep, attr = path.partition(":")
    if not sep:
        module, _, attr = path.rpartition(".")
    if not module or not attr:
        raise SettingsError(f"{path!r} is not a dotted path like 'package.module:name'")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise SettingsError(f"cannot load {path!r}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class RlgwSettings:
    """The gateway to use and how to run each task there."""

    gateway_url: str
    gateway_key: str | None = None
    runner: str = "chat"
    scaffold_options: dict[str, Any] = field(default_factory=dict)
    max_turns: int = 10
    reward: str | None = None

    @classmethod
    def from_mapping(cls, get: Callable[[str], Any] | Mapping[str, Any]) -> RlgwSettings:
        """Read `gateway_url`, `gateway_key`, `runner`, ... from `get(name)` (or a mapping), then `RLGW_*`."""
        lookup = get.get if isinstance(get, Mapping) else get

        def value(name: str, default: Any = None) -> Any:
            found = lookup(name)
            return found if found is not None else os.environ.get(f"RLGW_{name.upper()}", default)

        url = value("gateway_url")
        if not url:
            raise SettingsError(
                "no rlgw gateway: set gateway_url (or RLGW_GATEWAY_URL), e.g. http://127.0.0.1:8000"
            )
        options = value("scaffold_options") or {}
        if not isinstance(options, Mapping):
            raise SettingsError(f"scaffold_options must be a mapping, not {type(options).__name__}")
        try:
            max_turns = int(value("max_turns", 10))
        except (TypeError, ValueError) as exc:
            raise SettingsError(f"max_turns must be an integer: {exc}") from exc
        return cls(
            str(url),
            value("gateway_key"),
            str(value("runner", "chat")),
            dict(options),
            max_turns,
            value("reward"),
        )

    def build_runner(self) -> TaskRunner:
        """The task runner `runner` names (see the module docstring)."""
        if self.runner.startswith("scaffold:"):
            return ScaffoldRunner(
                self.runner.removeprefix("scaffold:"), self.scaffold_options, self.max_turns
            )
        if self.runner == "chat":
            if self.reward is None:
                raise SettingsError("runner 'chat' needs reward: a dotted path to a reward function")
            return AgentRunner(ChatLoop(reward=load_object(self.reward), max_turns=self.max_turns))
        agent = load_object(self.runner)
        if not callable(agent):
            raise SettingsError(f"runner {self.runner!r} is not callable")
        return AgentRunner(agent)
