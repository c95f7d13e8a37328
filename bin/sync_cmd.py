"""`rlgw sync`: publish weight versions, apply them to engines, check the fleet, apply retention."""

from __future__ import annotations

import argparse

EPILOG = """examples:
  # trainer host: publish a checkpoint as v1 (full), later ones as xor deltas (every 10th full)
  rlgw sync publish --root /shared/weights --version 1 --from /ckpt/step-100
  rlgw sync publish --root /shared/weights --version 2 --from /ckpt/step-200 --kind delta
  # make every engine pull v2 into its host-local dir and reload; then prove it
  rlgw sync apply --root /shared/weights --version 2 --local-dir /nvme/rollout-ckpt \\
      --engine http://10.0.0.5:30000 --engine http://10.0.0.6:30000
  rlgw sync apply --root /shared/weights --version 2 --local-dir /nvme/ckpt --engine-kind vllm \\
      --engine http://10.0.0.7:8000   # vLLM: pulled here, reloaded in place
  rlgw sync status --root /shared/weights --engine http://10.0.0.5:30000 --engine http://10.0.0.6:30000
  # prefetch on a host without touching its engine; keep the 2 newest full versions
  rlgw sync apply --root /shared/weights --version 2 --local-dir /nvme/rollout-ckpt
  rlgw sync gc --root /shared/weights --keep-full 2
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `rlgw sync` and its four actions."""
    p = sub.add_parser(
        "sync",
        help="publish, apply and check weight versions",
        description="Weight versions on disk (full and delta), applied to engines and checked fleet-wide.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    pub = actions.add_parser(
        "publish",
        help="publish a safetensors checkpoint as a version",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    pub.add_argument("--root", required=True, help="directory holding weight_vNNNNNN versions")
    pub.add_argument("--version", type=int, required=True, help="version number to publish")
    pub.add_argument("--from", dest="source", required=True, help="HF checkpoint directory (safetensors)")
    pub.add_argument("--kind", choices=("full", "delta"), default="full", help="full (default) or delta")
    pub.add_argument("--encoding", choices=("xor", "overwrite"), default="xor", help="delta encoding")
    pub.add_argument("--keep-full", type=int, default=2, help="full versions kept by retention (default 2)")
    pub.add_argument("--no-fsync", action="store_true", help="skip fsync (scratch runs only)")

    app = actions.add_parser(
        "apply",
        help="bring engines (or a local dir) to a version",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    app.add_argument("--root", required=True, help="directory holding the published versions")
    app.add_argument("--version", type=int, required=True, help="target version")
    app.add_argument("--engine", action="append", default=[], help="engine base URL (repeatable)")
    app.add_argument("--local-dir", default=None, help="host-local checkpoint directory")
    app.add_argument(
        "--engine-kind",
        choices=("rlgw", "vllm", "sglang"),
        default="rlgw",
        help="rlgw: engines that pull themselves (/pull_weights); vllm: pull here into --local-dir, then "
        "reload each vLLM in place (needs VLLM_SERVER_DEV_MODE=1 on the server); sglang: pull here, then "
        "each SGLang loads it with /update_weights_from_disk",
    )

    st = actions.add_parser(
        "status",
        help="each engine's version and digests; exit 1 on mismatch",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    st.add_argument("--engine", action="append", required=True, help="engine base URL (repeatable)")
    st.add_argument("--root", default=None, help="expect the newest version published here")
    st.add_argument("--expect-version", type=int, default=None, help="expect this version")
    st.add_argument("--no-live", action="store_true", help="skip hashing the live weights")

    gc = actions.add_parser("gc", help="apply retention to a publish root")
    gc.add_argument("--root", required=True, help="directory holding the published versions")
    gc.add_argument("--keep-full", type=int, default=2, help="full versions to keep (default 2)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Dispatch to the chosen action; every sync failure is a non-zero exit with the reason."""
    from rlgw.sync.errors import WeightSyncError

    try:
        return {"publish": _publish, "apply": _apply, "status": _status, "gc": _gc}[args.action](args)
    except WeightSyncError as exc:
        print(f"rlgw sync {args.action}: {type(exc).__name__}: {exc}")
        return 1


def _bar(total: int | None, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, mininterval=1.0)


def _publish(args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    from safetensors import safe_open

    from rlgw.sync import checkpoint as ck
    from rlgw.sync.errors import VersionError
    from rlgw.sync.publisher import WeightPublisher
    from rlgw.sync.pull import pull

    root, source = Path(args.root), Path(args.source)
    pub = WeightPublisher(
        root, encoding=args.encoding, keep_full=args.keep_full, aux_src=source, durable=not args.no_fsync
    )
    versions = ck.list_versions(root)
    with tempfile.TemporaryDirectory(dir=root if root.is_dir() else None, prefix=".base-") as scratch:
        if args.kind == "delta":
            if not versions:
                raise VersionError(f"no version in {root} to diff against; publish a full one first")
            prev = versions[-1].version
            print(f"rebuilding base v{prev} to diff against")
            base = pull(root, prev, Path(scratch), durable=False)
            pub.seed(base.path)
        state = {}
        for f in sorted(source.glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as sf:
                for name in sf.keys():
                    state[name] = sf.get_tensor(name)
        if not state:
            raise VersionError(f"{source} has no *.safetensors files")
        total = sum(t.numel() * t.element_size() for t in state.values())
        with _bar(total, f"publish v{args.version}") as bar:
            index = pub.publish(state.items(), args.version, kind=args.kind, progress=bar.update)
    print(f"published v{index.version} ({index.kind}, {index.encoding}) digest {index.checkpoint_digest}")
    return 0


def _apply(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    from rlgw.sync.client import SyncClient
    from rlgw.sync.pull import pull

    root = Path(args.root)
    local = Path(args.local_dir) if args.local_dir else None
    if not args.engine:
        if local is None:
            print("rlgw sync apply: give --engine URLs, or --local-dir to prefetch on this host")
            return 2
        # The chain (one full copy and N deltas) is planned inside pull: bytes done, no total.
        with _bar(None, f"apply v{args.version}") as bar:
            result = pull(root, args.version, local, progress=bar.update)
        state = "already there" if result.already else f"via {result.chain}"
        print(f"{result.path}: v{result.version} {state}, digest {result.checkpoint_digest}")
        return 0
    if args.engine_kind in ("vllm", "sglang"):
        import importlib

        reload = importlib.import_module(f"rlgw.sync.{args.engine_kind}_reload")
        result = asyncio.run(reload.apply_version(args.engine, root, args.version, local))
        print(f"{len(args.engine)} {args.engine_kind} engine(s) serve v{args.version} from {result.path}")
        return 0
    client = SyncClient(args.engine)

    async def go() -> None:
        task = asyncio.create_task(client.pull(root, args.version, local))
        t = 0
        while not task.done():
            await asyncio.wait({task}, timeout=5)
            t += 5
            if not task.done():
                print(f"  waiting for {len(args.engine)} engine(s) to pull v{args.version}: {t}s")
        await task

    asyncio.run(go())
    return _print_status(client, str(args.version), None, live=True)


def _print_status(client, version: str | None, digest: str | None, live: bool) -> int:
    import asyncio

    from rlgw.sync.fleet import fleet_problems

    statuses = asyncio.run(client.status(live))
    print(f"{'engine':40s} {'version':>10s}  {'checkpoint digest':32s}  {'live digest':32s}")
    for s in statuses:
        print(
            f"{s.url:40s} {s.weight_version or '-':>10s}  {s.checkpoint_digest or '-':32s}  "
            f"{s.live_digest or s.error or '-':32s}"
        )
    problems = fleet_problems(statuses, version, digest)
    for p in problems:
        print(f"MISMATCH: {p}")
    return 1 if problems else 0


def _status(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rlgw.sync import checkpoint as ck
    from rlgw.sync.client import SyncClient

    version, digest = args.expect_version, None
    if args.root:
        versions = ck.list_versions(Path(args.root))
        if versions:
            newest = (
                versions[-1] if version is None else next((v for v in versions if v.version == version), None)
            )
            if newest is not None:
                version = newest.version
                digest = ck.read_index(newest.path).checkpoint_digest
    return _print_status(
        SyncClient(args.engine), None if version is None else str(version), digest, not args.no_live
    )


def _gc(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rlgw.sync import checkpoint as ck

    removed = ck.gc_versions(Path(args.root), args.keep_full)
    for path in removed:
        print(f"removed {path}")
    print(f"kept: {[v.path.name for v in ck.list_versions(Path(args.root))]}")
    return 0
