"""`rlgw run`: run an installed scaffold on many tasks and print the summary table."""

from __future__ import annotations

import argparse
import json

EXAMPLE = """example:
  rlgw serve --port 8000 &        # gateway + embedded engine
  rlgw run --scaffold rlgw-mini --tasks tasks.jsonl --mode capture --concurrency 4 \\
      --gateway-url http://127.0.0.1:8000 --model tiny --max-turns 4
  rlgw run ... --ray local         # the same tasks as Ray tasks (or --ray ray://head:10001)
  rlgw run ... --sandbox rock      # ROCK sandboxes (ROCK_BASE_URL, ROCK_API_KEY, ROCK_IMAGE)
  rlgw run --scaffold openhands --scaffold-option version='"v1"' \\
      --scaffold-option venv='"/opt/openhands-venv"' --sampling '{"temperature": 0.7}' ...
  rlgw run --scaffold claude-code --scaffold-option prefix='"/opt/rlgw-agents/claude-code"' ...
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `rlgw run`."""
    p = sub.add_parser(
        "run",
        help="run an installed scaffold (rlgw-mini, openhands, terminus-2, mini-swe-agent, aider, hermes, "
        "claude-code, codex, opencode, qwen-code, pi, gemini-cli, cline, kilo, copilot, openclaw, "
        "kimi-code) on a tasks file",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scaffold", required=True,
                   help="rlgw-mini, openhands, terminus-2, mini-swe-agent, aider, hermes, claude-code, "
                   "codex, opencode, qwen-code, pi, gemini-cli, cline, kilo, copilot, openclaw "
                   "or kimi-code")  # fmt: skip
    p.add_argument("--scaffold-option", action="append", default=[], metavar="KEY=JSON",
                   help='scaffold option, value as JSON (repeatable), e.g. version="v1"')  # fmt: skip
    p.add_argument("--tasks", required=True, help="JSONL tasks file (see rlgw.scaffolds.tasks)")
    p.add_argument("--mode", choices=("capture", "eval"), default="capture",
                   help="capture: record samples to train on; eval: run and grade only")  # fmt: skip
    p.add_argument("--concurrency", type=int, default=4, help="task runs at once (default: 4)")
    p.add_argument("--gateway-url", default=None, help="rlgw gateway base URL (needed for capture)")
    p.add_argument("--gateway-key", default=None, help="tenant key for the gateway (or RLGW_API_KEY)")
    p.add_argument("--engine-openai-url", default=None, help="eval only: an OpenAI-compatible engine URL")
    p.add_argument("--model", default="default", help="model name the agent sends")
    p.add_argument("--max-turns", type=int, default=10, help="the agent's turn limit (default: 10)")
    p.add_argument("--sampling", default=None, metavar="JSON",
                   help="sampling (OpenAI names) for the session and the agent's own settings, "
                        "e.g. '{\"temperature\": 0.7}'")  # fmt: skip
    p.add_argument("--agent-timeout", type=float, default=1800.0, help="seconds per agent run")
    p.add_argument("--install-timeout", type=float, default=900.0,
                   help="seconds for installing the agent in a sandbox (default: 900)")  # fmt: skip
    p.add_argument("--sandbox", choices=("local", "rock"), default="local",
                   help="local subprocesses, or ROCK (ROCK_BASE_URL, ROCK_API_KEY, ROCK_IMAGE)")  # fmt: skip
    p.add_argument("--artifacts-dir", default=None, help="keep each run's logs and workspace here")
    p.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="fan out over the Ray cluster at ADDRESS (host:6379, ray://host:10001, auto; "
                        "'local' starts one); rlgw must be installed on every node")  # fmt: skip
    p.add_argument("--ray-retries", type=int, default=1, metavar="N",
                   help="run a task again up to N times when its Ray worker or node dies; past that "
                        "it is reported as infra_error")  # fmt: skip
    p.add_argument("--json", action="store_true", help="also print each result as a JSON line")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load tasks, run them locally or on Ray, print the summary; exit 1 if any run had an infra error."""
    import asyncio
    import os
    import sys
    from pathlib import Path

    from rlgw.sandboxes.factory import SandboxSpec
    from rlgw.scaffolds.agent import AgentConfig
    from rlgw.scaffolds.pool import RunSpec, format_summary, run_local, run_ray
    from rlgw.scaffolds.tasks import TaskFormatError, load_tasks

    try:
        tasks = load_tasks(Path(args.tasks))
    except (OSError, TaskFormatError) as e:
        print(f"rlgw run: {e}", file=sys.stderr)
        return 2
    options: dict = {}
    for item in args.scaffold_option:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"rlgw run: --scaffold-option {item!r} is not KEY=JSON", file=sys.stderr)
            return 2
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    if args.scaffold == "rlgw-mini" and args.sandbox == "local":
        options.setdefault("python", sys.executable)  # the local sandbox shares this interpreter
    try:
        sampling = json.loads(args.sampling) if args.sampling else None
    except json.JSONDecodeError as e:
        print(f"rlgw run: --sampling is not JSON: {e}", file=sys.stderr)
        return 2
    if sampling is not None and not isinstance(sampling, dict):
        print("rlgw run: --sampling must be a JSON object", file=sys.stderr)
        return 2
    if args.mode == "capture" and not args.gateway_url:
        print("rlgw run: --mode capture needs --gateway-url", file=sys.stderr)
        return 2
    spec = RunSpec(
        scaffold=args.scaffold,
        scaffold_options=options,
        sandbox=SandboxSpec(args.sandbox),
        gateway_url=args.gateway_url,
        gateway_key=args.gateway_key or os.environ.get("RLGW_API_KEY"),
        config=AgentConfig(
            mode=args.mode,
            model=args.model,
            max_turns=args.max_turns,
            agent_timeout_s=args.agent_timeout,
            install_timeout_s=args.install_timeout,
            sampling=sampling,
            engine_openai_url=args.engine_openai_url,
            artifacts_dir=Path(args.artifacts_dir) if args.artifacts_dir else None,
        ),
    )
    try:
        if args.ray:
            results = asyncio.run(
                run_ray(spec, tasks, address=args.ray, concurrency=args.concurrency, retries=args.ray_retries)
            )
        else:
            results = asyncio.run(run_local(spec, tasks, concurrency=args.concurrency))
    except ValueError as e:  # bad scaffold name/options, capture conflicts
        print(f"rlgw run: {e}", file=sys.stderr)
        return 2
    if args.json:
        for r in results:
            print(json.dumps(r.to_dict()))
    print(format_summary(results))
    return 1 if any(r.failed_stage for r in results) else 0
