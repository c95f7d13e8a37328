"""`rlgw serve`: placeholder until its issue lands (replaced by the owning work)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `rlgw serve`."""
    p = sub.add_parser("serve", help="(not built yet)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Not built yet."""
    raise SystemExit("rlgw serve: not built yet")
