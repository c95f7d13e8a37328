"""`rlgw tenants add|list|limits|revoke`: manage a running gateway's tenants through its admin API.

It talks HTTP to `/admin/tenants` rather than writing the data dir's tenant file: the running
gateway applies a change at once (a revoked key stops on the next request), the admin key is
checked in one place, and it works from any machine that can reach the gateway. The admin key
comes from RLGW_ADMIN_KEY or --admin-key-file, never from the command line (argv is visible to
every user of the machine).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

EXAMPLES = """examples:
  export RLGW_ADMIN_KEY=...                      # or --admin-key-file /run/secrets/rlgw-admin
  rlgw tenants add team-a --open-sessions 512 --in-flight 256 --tokens-per-minute 2000000
  rlgw tenants list
  rlgw tenants limits team-a --in-flight 64         # replaces team-a's own limits; its key stays
  rlgw tenants revoke team-a
  rlgw tenants --url http://gw:8000 list         # another gateway (default: $RLGW_URL or :8000)
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `rlgw tenants`."""
    p = sub.add_parser(
        "tenants",
        help="add, list or revoke tenants of a running gateway (admin key required)",
        description="Manage tenants through a running gateway's admin API.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--url",
        default=os.environ.get("RLGW_URL", "http://127.0.0.1:8000"),
        help="the gateway's base URL (default: $RLGW_URL or http://127.0.0.1:8000)",
    )
    p.add_argument("--admin-key-file", type=Path, help="file holding the admin key (else $RLGW_ADMIN_KEY)")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="create a tenant; prints its API key once")
    add.add_argument("name", help="tenant name: letters, digits, '.', '_', '-' (at most 64)")
    _limit_args(add)
    actions.add_parser("list", help="tenants with their limits and current use")
    limits = actions.add_parser(
        "limits", help="replace a tenant's own limits (unset: the gateway's defaults)"
    )
    limits.add_argument("name", help="the tenant whose limits change (its key stays)")
    _limit_args(limits)
    revoke = actions.add_parser("revoke", help="delete a tenant: its key stops working at once")
    revoke.add_argument("name", help="the tenant to remove: its key stops working at once")
    p.set_defaults(func=run)


def _limit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--open-sessions", type=int, help="its open-session limit (default: the gateway's)")
    p.add_argument("--in-flight", type=int, help="its requests-in-flight limit (default: the gateway's)")
    p.add_argument(
        "--tokens-per-minute", type=int, help="its generated tokens per minute (default: the gateway's)"
    )


def _admin_key(args: argparse.Namespace) -> str:
    key = args.admin_key_file.read_text().strip() if args.admin_key_file else os.environ.get("RLGW_ADMIN_KEY")
    if not key:
        raise SystemExit("rlgw tenants: set RLGW_ADMIN_KEY or pass --admin-key-file")
    return key


def run(args: argparse.Namespace) -> int:
    """Do the action; prints the gateway's JSON answer, exit code 1 on an error answer."""
    import httpx

    base = args.url.rstrip("/") + "/admin/tenants"
    headers = {"Authorization": f"Bearer {_admin_key(args)}"}
    try:
        limits = {
            "open_sessions": getattr(args, "open_sessions", None),
            "in_flight": getattr(args, "in_flight", None),
            "tokens_per_minute": getattr(args, "tokens_per_minute", None),
        }
        if args.action == "add":
            r = httpx.post(base, json={"name": args.name, "limits": limits}, headers=headers, timeout=30)
        elif args.action == "limits":
            r = httpx.put(f"{base}/{args.name}/limits", json=limits, headers=headers, timeout=30)
        elif args.action == "list":
            r = httpx.get(base, headers=headers, timeout=30)
        else:
            r = httpx.delete(f"{base}/{args.name}", headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        print(f"rlgw tenants: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 2
    try:
        doc = r.json()
    except ValueError:
        doc = {"error": {"message": r.text[:500]}}
    if r.is_error:
        print(f"rlgw tenants: {r.status_code}: {doc.get('error', {}).get('message', doc)}", file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=2))
    return 0
