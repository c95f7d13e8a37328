"""rlgw-mini: a small agent with one bash tool, the `openai` client and a turn budget.

This file is copied into the sandbox and run there as a script, so it imports only the
standard library and `openai`. It reads its endpoint from OPENAI_BASE_URL / OPENAI_API_KEY,
appends every message to its history (never rewrites it, so capture stays append-only), and
writes one JSON line per event to `--log`. Its last event says how it ended:

    finish                    the model answered without a tool call
    max_turns                 the turn budget ran out
    context_length_exceeded   the endpoint refused the prompt as too long
    error                     anything else (exit code 1)

Exit codes: 0 for finish and max_turns, 3 for context_length_exceeded, 1 for error.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

SYSTEM = (
    "You are a careful software agent working in a shell. Use the bash tool to inspect and change "
    "files in the current directory. When the task is done, answer with a short summary and no tool call."
)
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command in the task directory; returns its exit code and output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the command to run"}},
            "required": ["command"],
        },
    },
}
MAX_OBSERVATION_CHARS = 8000


def run_bash(arguments: str, timeout: float) -> str:
    """Run the tool call's command; the observation is its exit code and (clipped) output."""
    try:
        command = json.loads(arguments)["command"]
        if not isinstance(command, str):
            raise TypeError("command must be a string")
    except (ValueError, KeyError, TypeError) as e:
        return f'error: invalid arguments for bash ({e}); expected {{"command": "..."}}'
    try:
        proc = subprocess.run(
            ["bash", "-c", command], capture_output=True, text=True, timeout=timeout, errors="replace"
        )
    except subprocess.TimeoutExpired:
        return f"error: command timed out after {timeout:.0f}s"
    out = (proc.stdout + proc.stderr)[-MAX_OBSERVATION_CHARS:]
    return f"exit code {proc.returncode}\n{out}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="rlgw-mini agent")
    parser.add_argument("--instruction-file", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--command-timeout", type=float, default=60.0)
    parser.add_argument("--log", required=True)
    args = parser.parse_args(argv)

    import openai  # imported late: `--help` works without it

    client = openai.OpenAI(max_retries=0, timeout=600.0)
    with open(args.instruction_file) as f:
        instruction = f.read()
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": instruction}]
    log = open(args.log, "a", buffering=1)

    def event(kind: str, **fields: object) -> None:
        log.write(json.dumps({"event": kind, "ts": time.time(), **fields}) + "\n")

    event("start", model=args.model, max_turns=args.max_turns)
    try:
        for turn in range(1, args.max_turns + 1):
            reply = client.chat.completions.create(
                model=args.model, messages=messages, tools=[BASH_TOOL], max_tokens=args.max_tokens
            )
            msg = reply.choices[0].message
            calls = msg.tool_calls or []
            assistant: dict = {"role": "assistant", "content": msg.content}
            if calls:
                assistant["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                                  "arguments": c.function.arguments}}
                    for c in calls
                ]  # fmt: skip
            messages.append(assistant)
            event("turn", turn=turn, content=msg.content, tool_calls=len(calls),
                  finish_reason=reply.choices[0].finish_reason)  # fmt: skip
            if not calls:
                event("finish", turns=turn, content=msg.content)
                return 0
            for call in calls:
                if call.function.name == "bash":
                    observation = run_bash(call.function.arguments, args.command_timeout)
                else:
                    observation = f"error: unknown tool {call.function.name!r}; the only tool is bash"
                messages.append({"role": "tool", "tool_call_id": call.id, "content": observation})
                event("observation", turn=turn, content=observation[:2000])
        event("max_turns", turns=args.max_turns)
        return 0
    except openai.BadRequestError as e:
        code = getattr(e, "code", None)
        if code is None and isinstance(e.body, dict):
            code = e.body.get("code")
        if code == "context_length_exceeded" or "context length" in str(e).lower():
            event("context_length_exceeded", detail=str(e)[:2000])
            return 3
        event("error", detail=f"{type(e).__name__}: {e}"[:2000])
        return 1
    except Exception as e:
        event("error", detail=f"{type(e).__name__}: {e}"[:2000])
        return 1
    finally:
        log.close()


if __name__ == "__main__":
    sys.exit(main())
