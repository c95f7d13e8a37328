"""Entry point of the `rlgw` command: dispatches to one module per subcommand.

Each subcommand module defines `add_parser(subparsers)` (cheap: argparse only) and
`run(args) -> int` (imports its heavy dependencies lazily, so `--help` stays fast).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from rlgw import __version__

SUBCOMMANDS = ("serve", "engine", "run", "trajectories", "sync", "train", "tenants")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="rlgw",
        description="OpenAI-compatible recording gateway for agentic RL.",
    )
    parser.add_argument("--version", action="version", version=f"rlgw {__version__}")
    parser.add_argument("--log-level", default="info", help="debug, info, warning or error (default: info)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"rlgw.bin.{name}_cmd")
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` and run the chosen subcommand; returns the process exit code."""
    from rlgw.logs import configure_logging

    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
