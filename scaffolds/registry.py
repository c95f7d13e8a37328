"""Scaffolds by name: `build_scaffold("rlgw-mini", {...})` and the list the CLI offers."""

from __future__ import annotations

from typing import Any

from rlgw.scaffolds.aider import AiderScaffold
from rlgw.scaffolds.claude_code import ClaudeCodeScaffold
from rlgw.scaffolds.cline import ClineScaffold
from rlgw.scaffolds.codex import CodexScaffold
from rlgw.scaffolds.copilot import CopilotScaffold
from rlgw.scaffolds.gemini_cli import GeminiCliScaffold
from rlgw.scaffolds.hermes import HermesScaffold
from rlgw.scaffolds.kilo import KiloScaffold
from rlgw.scaffolds.kimi_code import KimiCodeScaffold
from rlgw.scaffolds.mini import MiniScaffold
from rlgw.scaffolds.mini_swe_agent import MiniSweAgentScaffold
from rlgw.scaffolds.openclaw import OpenClawScaffold
from rlgw.scaffolds.opencode import OpencodeScaffold
from rlgw.scaffolds.openhands import OpenHandsScaffold
from rlgw.scaffolds.pi import PiScaffold
from rlgw.scaffolds.qwen_code import QwenCodeScaffold
from rlgw.scaffolds.scaffold import InstalledScaffold
from rlgw.scaffolds.terminus import Terminus2Scaffold

SCAFFOLDS: dict[str, type[InstalledScaffold]] = {
    MiniScaffold.name: MiniScaffold,
    OpenHandsScaffold.name: OpenHandsScaffold,
    Terminus2Scaffold.name: Terminus2Scaffold,
    ClaudeCodeScaffold.name: ClaudeCodeScaffold,
    CodexScaffold.name: CodexScaffold,
    OpencodeScaffold.name: OpencodeScaffold,
    QwenCodeScaffold.name: QwenCodeScaffold,
    PiScaffold.name: PiScaffold,
    GeminiCliScaffold.name: GeminiCliScaffold,
    MiniSweAgentScaffold.name: MiniSweAgentScaffold,
    AiderScaffold.name: AiderScaffold,
    ClineScaffold.name: ClineScaffold,
    KiloScaffold.name: KiloScaffold,
    CopilotScaffold.name: CopilotScaffold,
    HermesScaffold.name: HermesScaffold,
    OpenClawScaffold.name: OpenClawScaffold,
    KimiCodeScaffold.name: KimiCodeScaffold,
}


def build_scaffold(name: str, options: dict[str, Any] | None = None) -> InstalledScaffold:
    """The scaffold called `name`, built with keyword `options`."""
    try:
        cls = SCAFFOLDS[name]
    except KeyError:
        raise ValueError(f"unknown scaffold {name!r}; known: {', '.join(sorted(SCAFFOLDS))}") from None
    return cls(**(options or {}))
