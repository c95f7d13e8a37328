"""Kimi Code CLI (`@moonshot-ai/kimi-code` on npm, not its installer script) as an installed scaffold, on
Node 24 from npm (it wants Node >= 22.19).

Runs `kimi -p TASK --output-format stream-json` (its print mode: one prompt, non-interactive, every action
approved automatically) in the workspace, with its data directory (`KIMI_CODE_HOME`) in the scaffold's own
directory holding a `config.toml` rlgw writes: an `openai` (Chat Completions) provider `rlgw` on the
session's URL, its key read from `RLGW_SESSION_KEY` (`api_key_env`), and a model alias `rlgw` for the
session's model as `default_model`. The run's `max_tokens`, else 8192, is its completion cap
(`modelOverrides.maxCompletionTokens`: Kimi otherwise asks for the model's whole declared context). The
turn limit is `loop_control.max_steps_per_turn`. Telemetry and automatic session titles (a side call) are
off.

History: Kimi has no switch for its automatic compaction; it compacts at 85% of the model's declared
`max_context_size` or when less than `loop_control.reserved_context_size` is left. Capture declares a
context beyond any model's (2^40 tokens) and reserves nothing, so only an endpoint's overflow error can make
it compact; eval declares 262,144 tokens (Kimi's own default for a model it does not know) and keeps its
defaults.

Termination: exit 0 is `finish`. Otherwise its stderr names the error code (`error: failed to run prompt:
CODE: message`): `loop.max_steps_exceeded` is `max_turns`, `context.overflow` (or a message naming an
overflow) `context_length_exceeded`, anything else `error`. The model calls are its `assistant` events.
This module knows nothing about sandboxes or the gateway.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rlgw.scaffolds.node_cli import CONTEXT_ERROR, NodeCliScaffold, output_cap
from rlgw.scaffolds.scaffold import ScaffoldContext, TrajectoryInfo
from rlgw.scaffolds.termination import TerminationReason as R

ALIAS = "rlgw"
KEY_VARIABLE = "RLGW_SESSION_KEY"
DEFAULT_MAX_TOKENS = 8192
# A declared context beyond any model's: Kimi's 85% compaction trigger is never reached.
NO_COMPACTION = 1 << 40
# What Kimi assumes of a model it does not know (`KIMI_MODEL_MAX_CONTEXT_SIZE`'s default).
DEFAULT_CONTEXT = 262144
_ERROR_CODE = re.compile(r"error: (?:failed to run prompt: )?([a-z_]+\.[a-z_]+)\b(.*)")
_CODES = {"loop.max_steps_exceeded": R.MAX_TURNS, "context.overflow": R.CONTEXT_LENGTH_EXCEEDED}


class KimiCodeScaffold(NodeCliScaffold):
    """Kimi Code headless (`kimi -p`), pinned `version` of `@moonshot-ai/kimi-code`, on Node 24."""

    name = "kimi-code"
    package = "@moonshot-ai/kimi-code"
    binary = "kimi"
    default_version = "2.1.0"
    default_node_version = "24.22.3"

    def config_toml(self, ctx: ScaffoldContext) -> str:
        """Kimi's `config.toml` for this run (TOML basic strings take JSON's escapes)."""
        capture = ctx.mode == "capture"
        lines = [
            f"default_model = {json.dumps(ALIAS)}",
            "telemetry = false",
            "auto_session_title = false",
            "",
            f"[providers.{ALIAS}]",
            'type = "openai"',
            f"base_url = {json.dumps(ctx.llm.base_url)}",
            f"api_key_env = {json.dumps(KEY_VARIABLE)}",
            "",
            f"[models.{ALIAS}]",
            f"provider = {json.dumps(ALIAS)}",
            f"model = {json.dumps(ctx.llm.model)}",
            f"max_context_size = {NO_COMPACTION if capture else DEFAULT_CONTEXT}",
            "",
            "[loop_control]",
            f"max_steps_per_turn = {ctx.max_turns}",
            *(["reserved_context_size = 0"] if capture else []),
            "",
            "[modelOverrides]",
            f"maxCompletionTokens = {output_cap(ctx) or DEFAULT_MAX_TOKENS}",
        ]
        return "\n".join(lines) + "\n"

    def install_files(self, ctx: ScaffoldContext) -> dict[str, str]:
        return {**super().install_files(ctx), f"{ctx.home}/kimi-home/config.toml": self.config_toml(ctx)}

    def argv(self, ctx: ScaffoldContext) -> list[str]:
        return [self.executable, "--output-format", "stream-json", "-p"]

    def env(self, ctx: ScaffoldContext) -> dict[str, str]:
        return {
            "KIMI_CODE_HOME": f"{ctx.home}/kimi-home",
            KEY_VARIABLE: ctx.llm.api_key,
            "KIMI_DISABLE_TELEMETRY": "1",
        }

    def parse_events(
        self, events: list[dict[str, Any]], stderr: str, exit_code: int | None, max_turns: int
    ) -> TrajectoryInfo:
        info = TrajectoryInfo(turns=sum(1 for e in events if e.get("role") == "assistant"))
        if exit_code == 0:
            info.signals.add(R.FINISH)
        elif m := _ERROR_CODE.search(stderr):
            code, message = m[1], m[2]
            reason = _CODES.get(code, R.ERROR)
            info.signals.add(R.CONTEXT_LENGTH_EXCEEDED if CONTEXT_ERROR.search(message) else reason)
            info.detail = f"{code}{message[:300]}"
        return info
