"""`rlgw serve`: the recording gateway, in front of an SGLang URL or the embedded engine."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

EXAMPLES = """examples:
  rlgw serve                                   # embedded engine (SmolLM2 on CPU) + gateway on :8000
  rlgw serve --model tests/fixtures/tiny-qwen3 # embedded engine on another checkpoint
  rlgw serve --engine-url http://router:30000  # in front of SGLang / sglang-router
  rlgw serve --engine-url http://vllm:8000 --engine-kind vllm  # vLLM (serve it with --enable-scale-out)
  RLGW_TENANT_KEYS='team-a:KEY1,team-b:KEY2' rlgw serve --engine-url http://router:30000
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `rlgw serve`."""
    p = sub.add_parser(
        "serve",
        help="run the recording gateway (with the embedded engine unless --engine-url is given)",
        description="Run the OpenAI-compatible recording gateway.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--engine-url", help="SGLang (or sglang-router) base URL; default: start the embedded engine"
    )
    p.add_argument(
        "--engine-kind",
        default="sglang",
        choices=["sglang", "vllm", "auto"],
        help="the protocol --engine-url speaks: sglang (also sglang-router and rlgw engine), vllm "
        "(its /inference/v1/generate), or auto (asks the server; default: sglang)",
    )
    p.add_argument(
        "--model", default="smollm2", help="embedded engine's model: a checkpoint dir or 'smollm2'"
    )
    p.add_argument("--engine-port", type=int, default=0, help="embedded engine's port (default: a free one)")
    p.add_argument("--engine-threads", type=int, default=None, help="embedded engine's torch threads")
    p.add_argument(
        "--cache-mib",
        type=int,
        default=None,
        help="embedded engine's prefix cache budget in MiB of KV (default 1024; 0: off)",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address the gateway listens on (default: 127.0.0.1; 0.0.0.0: all)",
    )
    p.add_argument("--port", type=int, default=8000, help="port the gateway listens on (default: 8000)")
    p.add_argument(
        "--data-dir", type=Path, default=None, help="trajectory store dir (default: ~/.local/share/rlgw)"
    )
    p.add_argument("--tokenizer", help="tokenizer dir (default: the engine's tokenizer_path)")
    p.add_argument(
        "--chat-template", help="a Jinja chat template (file path or text) overriding the tokenizer's"
    )
    p.add_argument(
        "--tool-parser",
        default="auto",
        choices=["auto", "none", "hermes", "qwen25", "qwen", "qwen3_coder"],
        help="how tool calls are read from the model's output (default: auto, from the chat template)",
    )
    p.add_argument(
        "--reasoning-parser",
        default="auto",
        choices=["auto", "none", "qwen3"],
        help="how <think> reasoning is split from the answer (default: auto, from the chat template)",
    )
    p.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="the model's context window in tokens (default: from the engine or the model's config)",
    )
    p.add_argument(
        "--policy",
        default="segment",
        choices=["segment", "passthrough", "refuse"],
        help="when an agent rewrites history: open a new segment, stop capturing, or answer 409",
    )
    p.add_argument(
        "--allow-template-mismatch",
        action="store_true",
        help="start even if the template probe finds increments that differ from full renders",
    )
    p.add_argument(
        "--journal-sync",
        default="normal",
        choices=["normal", "full"],
        help="session journal durability: normal survives a killed gateway, full also power loss "
        "(an fsync per turn)",
    )
    p.add_argument(
        "--store",
        default=None,
        metavar="URL",
        help="trajectory store: a postgresql:// URL several gateways share (default: SQLite in --data-dir)",
    )
    p.add_argument(
        "--journal",
        default=None,
        metavar="URL",
        help="session journal: a postgresql:// URL shared by several gateways (default: files in --data-dir)",
    )
    p.add_argument(
        "--session-ttl", type=float, default=6 * 3600.0, help="seconds after which an idle session is dropped"
    )
    p.add_argument(
        "--default-max-tokens",
        type=int,
        default=None,
        help="output cap of a turn whose request and session name none (default: 16384, the gateway's "
        "DEFAULT_MAX_TOKENS; 0: the rest of the context)",
    )
    p.add_argument("--public-url", help="base URL agents reach this gateway at (for session base_url)")
    p.add_argument("--served-model-name", help="model name reported to agents")
    p.add_argument(
        "--tenant-keys-file",
        type=Path,
        help='JSON {"tenant": "key", ...}; also RLGW_TENANT_KEYS="tenant:key,...". None: open, one tenant',
    )
    add_operations_args(p)
    p.set_defaults(func=run)


def add_operations_args(p: argparse.ArgumentParser) -> None:
    """Tenants, limits and shutdown: the admin key (a file or RLGW_ADMIN_KEY), per-tenant limits,
    request caps and the drain bound."""
    p.add_argument(
        "--admin-key-file",
        type=Path,
        help="file holding the admin key that manages tenants (/admin/tenants, rlgw tenants); "
        "also RLGW_ADMIN_KEY. Never pass a key on the command line",
    )
    p.add_argument("--max-open-sessions", type=int, help="open sessions per tenant (default: unlimited)")
    p.add_argument("--max-in-flight", type=int, help="requests in flight per tenant (default: unlimited)")
    p.add_argument("--max-tokens-per-minute", type=int, help="tokens generated per tenant (no limit)")
    p.add_argument("--max-body-bytes", type=int, default=32 * 1024 * 1024, help="request body cap (413)")
    p.add_argument("--max-messages", type=int, default=10_000, help="messages per request (400 over it)")
    p.add_argument("--max-tools", type=int, default=512, help="tools per request (400 over it)")
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM, seconds to let turns in flight finish before they are cancelled (default: 30)",
    )


def _admin_key(args: argparse.Namespace) -> str | None:
    if args.admin_key_file:
        return args.admin_key_file.read_text().strip() or None
    return os.environ.get("RLGW_ADMIN_KEY") or None


def _tenant_keys(args: argparse.Namespace) -> dict[str, str]:
    pairs: dict[str, str] = {}
    if args.tenant_keys_file:
        for tenant, key in json.loads(args.tenant_keys_file.read_text()).items():
            pairs[str(key)] = str(tenant)
    for item in filter(None, os.environ.get("RLGW_TENANT_KEYS", "").split(",")):
        tenant, _, key = item.partition(":")
        if not key:
            raise SystemExit("RLGW_TENANT_KEYS must look like 'tenant:key,tenant2:key2'")
        pairs[key] = tenant
    return pairs


def port_in_use(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on (one line), or None if it can.

    Checked before anything is loaded, so a second `rlgw serve` fails in a second, not after
    the engine has started. The probe socket sets SO_REUSEADDR as uvicorn does, so a port left
    in TIME_WAIT by a previous run is not reported busy.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return f"cannot listen on {host}:{port}: {exc.strerror or exc} (another rlgw serve? pick --port)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _ends_with_us() -> Callable[[], None] | None:
    """A `preexec_fn` that has Linux send the child SIGTERM when this process dies (None elsewhere).

    uvicorn ends `rlgw serve` on SIGTERM by raising the signal again after its graceful shutdown,
    so no `finally` of ours runs then (nor after a kill -9): the engine must not outlive us on its
    own account. prctl is looked up here, before the fork; the child only calls it.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def in_child() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # we died before the request was made
            os.kill(os.getpid(), signal.SIGTERM)

    return in_child


@contextlib.contextmanager
def embedded_engine(args: argparse.Namespace) -> Iterator[str]:
    """Run `rlgw engine` in a child process; yields its URL once healthy, stops it after."""
    import httpx

    port = args.engine_port or _free_port()
    cmd = [sys.executable, "-m", "rlgw.bin.main", "--log-level", args.log_level, "engine"]
    cmd += ["--model", args.model, "--port", str(port)]
    if args.engine_threads:
        cmd += ["--threads", str(args.engine_threads)]
    if args.cache_mib is not None:
        cmd += ["--cache-mib", str(args.cache_mib)]
    print(f"rlgw serve: starting the embedded engine ({args.model}) on 127.0.0.1:{port}", file=sys.stderr)
    proc = subprocess.Popen(cmd, preexec_fn=_ends_with_us())
    url = f"http://127.0.0.1:{port}"
    try:
        last = time.monotonic()
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"rlgw serve: the embedded engine exited with code {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() - last > 15:
                print("rlgw serve: waiting for the embedded engine...", file=sys.stderr)
                last = time.monotonic()
            time.sleep(0.3)
        print(f"rlgw serve: embedded engine ready at {url}", file=sys.stderr)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def run(args: argparse.Namespace) -> int:
    """Start the gateway (and the embedded engine if needed) until interrupted."""
    if problem := port_in_use(args.host, args.port):
        print(f"rlgw serve: {problem}", file=sys.stderr)
        return 2
    if args.engine_url and args.cache_mib is not None:
        print(
            "rlgw serve: --cache-mib sets the embedded engine's cache; not with --engine-url", file=sys.stderr
        )
        return 2
    if args.cache_mib is not None and args.cache_mib < 0:
        print("rlgw serve: --cache-mib must be at least 0 (0 turns the prefix cache off)", file=sys.stderr)
        return 2
    for flag, url in (("--store", args.store), ("--journal", args.journal)):
        if url is not None and not url.startswith(("postgresql://", "postgres://")):
            print(f"rlgw serve: {flag} takes a postgresql:// URL, got {url!r}", file=sys.stderr)
            return 2
    import uvicorn

    from rlgw.gateway.app import GatewayConfig, create_app
    from rlgw.gateway.http.body_limits import RequestCaps
    from rlgw.gateway.http.server_protocol import CoalescingHttpToolsProtocol
    from rlgw.gateway.ledger.ledger import Policy
    from rlgw.gateway.tenancy.limits import Limits
    from rlgw.gateway.trajectories.store import default_data_dir
    from rlgw.gateway.turns.lifecycle import DEFAULT_MAX_TOKENS

    tenant_keys = _tenant_keys(args)
    with contextlib.ExitStack() as stack:
        engine_url = args.engine_url or stack.enter_context(embedded_engine(args))
        kind = args.engine_kind if args.engine_url else "sglang"
        if kind == "auto":
            from rlgw.gateway.engine_client.vllm_backend import detect_engine_kind

            kind = detect_engine_kind(engine_url)
        config = GatewayConfig(
            engine_url=engine_url,
            engine_kind=kind,
            data_dir=args.data_dir or default_data_dir(),
            tokenizer=args.tokenizer,
            chat_template=args.chat_template,
            tool_parser=args.tool_parser,
            reasoning_parser=args.reasoning_parser,
            context_length=args.context_length,
            default_max_tokens=DEFAULT_MAX_TOKENS
            if args.default_max_tokens is None
            else (args.default_max_tokens or None),
            tenant_keys=tenant_keys,
            public_url=args.public_url,
            default_policy=Policy(args.policy),
            served_model_name=args.served_model_name,
            allow_template_mismatch=args.allow_template_mismatch,
            journal_sync=args.journal_sync,
            store=args.store,
            journal=args.journal,
            session_ttl=args.session_ttl,
            admin_key=_admin_key(args),
            default_limits=Limits(args.max_open_sessions, args.max_in_flight, args.max_tokens_per_minute),
            request_caps=RequestCaps(args.max_body_bytes, args.max_messages, args.max_tools),
        )
        print(
            f"rlgw serve: gateway on http://{args.host}:{args.port} ({kind} engine {engine_url})",
            file=sys.stderr,
        )
        uvicorn.run(
            create_app(config),
            host=args.host,
            port=args.port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=args.drain_timeout,
            http=CoalescingHttpToolsProtocol,
        )
    return 0
