"""Kilo Code's CLI (`@kilocode/cli` on npm) as an installed scaffold.

Kilo's CLI is a fork of opencode: the same config document (one `rlgw` provider on
`@ai-sdk/openai-compatible` with the session's base URL and key, the model's limits), the same
JSON events, and the same switches under `KILO_` names. So this is `OpencodeScaffold` with
Kilo's package, schema, default agent (`code`, whose `steps` is `max_turns`) and variables:
`KILO_CONFIG` names the config file, the models catalogue fetch, auto-update and sharing are
off (no internet in a sandbox), and capture turns auto-compaction and tool-output pruning off
(`KILO_DISABLE_AUTOCOMPACT`, `KILO_DISABLE_PRUNE`: both rewrite the history). Runs
`kilo run --format json -m rlgw/MODEL TASK`, tools allowed by the config's `permission` (7.7.7's
`--auto` flag, which should do the same, leaves the run hanging before its first request).

The pin is 7.7.7: 7.7.9 was never published, and 7.8.1 is the newest. Kilo takes a request that fails
for a network reason (refused, reset, timed out) for the machine being offline: it logs `session offline,
waiting for network` and probes kilo.ai, example.com and cloudflare.com until one answers, which
without internet is never, so such a run hangs until the run's wall-clock limit.

Termination: as opencode's.
"""

from __future__ import annotations

from typing import Any

from rlgw.scaffolds.opencode import OpencodeScaffold
from rlgw.scaffolds.scaffold import ScaffoldContext


class KiloScaffold(OpencodeScaffold):
    """Kilo Code headless (`kilo run`), pinned `version` of `@kilocode/cli`."""

    name = "kilo"
    package = "@kilocode/cli"
    binary = "kilo"
    default_version = "7.7.7"
    config_file = "kilo.json"

    def config(self, ctx: ScaffoldContext) -> dict[str, Any]:
        """Kilo's config document for this run: opencode's, with Kilo's schema and default agent."""
        config = super().config(ctx)
        config["$schema"] = "https://kilo.ai/config.json"
        config["agent"] = {"code": {"steps": ctx.max_turns}}
        # Tools run without asking (`kilo run --auto` does the same, but hangs before its first request).
        config["permission"] = {"edit": "allow", "bash": "allow", "webfetch": "allow"}
        return config

    def argv(self, ctx: ScaffoldContext) -> list[str]:
        return [self.executable, "run", "--format", "json", "-m", f"rlgw/{ctx.llm.model}"]

    def env(self, ctx: ScaffoldContext) -> dict[str, str]:
        env = {f"KILO_{key.removeprefix('OPENCODE_')}": value for key, value in super().env(ctx).items()}
        return {**env, "KILO_DISABLE_SHARE": "1"}
