"""Installed scaffolds: `InstalledAgent` (the per-task lifecycle: sandbox, install, session,
run, verify, finish) and one `InstalledScaffold` per agent (OpenHands V0 and V1, Terminus-2, the
npm CLIs Claude Code, Codex, opencode, qwen-code and pi, rlgw-mini), termination-reason
classification and trajectory-log parsing, and the `rlgw run` pool.

They drive agents as black boxes through a gateway session's base URL; they never touch tokens.
"""
