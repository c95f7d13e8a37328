"""`rlgw trajectories list|show|export|view`: read a trajectory store directly, read-only (the data dir's
SQLite file, or the PostgreSQL database `--store` names).

This module owns the command line and the export files; the on-disk format belongs to
`rlgw.gateway.trajectories.store`, the samples' Parquet schema to `rlgw.gateway.trajectories.parquet`
and the web pages of `view` to `rlgw.gateway.viewer.routes`.
It works with the gateway running or stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    from rlgw.gateway.trajectories.backends import Store
    from rlgw.gateway.trajectories.store import StoredSample

EXAMPLES = """\
examples:
  rlgw trajectories list --limit 20
  rlgw trajectories list --tenant team-a --after 1200
  rlgw trajectories show 1234
  rlgw trajectories export --format parquet --out batch.parquet --after 1200
  rlgw trajectories export --format jsonl | head -c 1000
  rlgw trajectories view --tokenizer tests/fixtures/tiny-qwen3   # then open http://127.0.0.1:8001/ui
  rlgw trajectories view --data-dir WORK/store --receipts WORK/receipts.jsonl  # /ui/training
"""
EXPORT_BATCH = 64


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `rlgw trajectories` and its three actions."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="the gateway's data directory (default: $RLGW_DATA_DIR or ~/.local/share/rlgw)",
    )
    common.add_argument(
        "--store",
        default=None,
        metavar="URL",
        help="a postgresql:// trajectory store (default: the data dir's)",
    )
    common.add_argument("--tenant", default=None, help="only this tenant's samples (default: all tenants)")
    p = sub.add_parser(
        "trajectories",
        help="list, show or export stored training samples",
        description="Read the trajectory store (read-only; works while the gateway runs).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    ls = actions.add_parser("list", parents=[common], help="a table of stored samples, oldest first")
    ls.add_argument("--after", type=int, default=0, help="only samples with a cursor above this")
    ls.add_argument("--limit", type=int, default=100, help="at most this many rows (default: 100)")

    show = actions.add_parser("show", parents=[common], help="one sample as JSON")
    show.add_argument("cursor", type=int, help="the sample's cursor (the first column of `list`)")

    ex = actions.add_parser(
        "export", parents=[common], help="write samples as JSONL or Parquet (slime field names)"
    )
    ex.add_argument(
        "--format", choices=("jsonl", "parquet"), required=True, help="JSON lines, or Parquet (needs pyarrow)"
    )
    ex.add_argument("--out", default="-", help="output file (default: '-', stdout; parquet needs a file)")
    ex.add_argument("--after", type=int, default=0, help="only samples with a cursor above this")

    view = actions.add_parser(
        "view", parents=[common], help="serve the trajectory viewer (web pages at /ui) on this store"
    )
    view.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    view.add_argument("--port", type=int, default=8001, help="port to listen on (default: 8001)")
    view.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer dir to show token text (default: none, token ids are shown)",
    )
    view.add_argument(
        "--receipts",
        type=Path,
        default=None,
        help="a `rlgw train` run's WORK_DIR/receipts.jsonl, charted at /ui/training (default: none)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Open the store read-only and run the chosen action; exit code 2 if there is no store."""
    from rlgw.gateway.trajectories.backends import open_store_readonly
    from rlgw.gateway.trajectories.store import StoreError, default_data_dir

    data_dir = args.data_dir if args.data_dir is not None else default_data_dir()
    if args.action == "view":
        return _view(data_dir, args)
    try:
        store = open_store_readonly(args.store, data_dir)
    except StoreError as exc:
        print(f"rlgw trajectories: {exc}", file=sys.stderr)
        return 2
    try:
        if args.action == "list":
            return _list(store, args)
        if args.action == "show":
            return _show(store, args)
        return _export(store, args)
    finally:
        store.close_sync()


def _view(data_dir: Path, args: argparse.Namespace) -> int:
    """Serve the viewer on the store until interrupted (its own read-only connection)."""
    import uvicorn

    from rlgw.bin.serve_cmd import port_in_use
    from rlgw.gateway.trajectories.backends import open_store_readonly
    from rlgw.gateway.trajectories.store import StoreError
    from rlgw.gateway.viewer.routes import viewer_app

    if problem := port_in_use(args.host, args.port):
        print(f"rlgw trajectories view: {problem}", file=sys.stderr)
        return 2
    try:
        store = open_store_readonly(args.store, data_dir)
    except StoreError as exc:
        print(f"rlgw trajectories: {exc}", file=sys.stderr)
        return 2
    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    scope = f"tenant {args.tenant}" if args.tenant else "all tenants"
    print(
        f"rlgw trajectories view: http://{args.host}:{args.port}/ui ({args.store or data_dir}, {scope})",
        file=sys.stderr,
    )
    try:
        uvicorn.run(
            viewer_app(store, scope=args.tenant, tokenizer=tokenizer, receipts=args.receipts),
            host=args.host,
            port=args.port,
            log_config=None,
            access_log=False,
        )
    finally:
        store.close_sync()
    return 0


def _list(store: Store, args: argparse.Namespace) -> int:
    header = ("cursor", "session", "task", "segment", "status", "reward", "response_length", "trainable")
    rows = [header]
    for s in store.list_sync(args.tenant, after=args.after, limit=args.limit):
        smp = s.sample
        reward = "-" if smp.reward is None else f"{smp.reward:g}"
        rows.append(
            (
                str(s.cursor),
                s.session_id,
                s.task_id,
                str(s.segment),
                str(smp.status),
                reward,
                str(smp.response_length),
                str(int(smp.loss_mask.sum())),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    if len(rows) == 1:
        print("(no samples)", file=sys.stderr)
    return 0


def _show(store: Store, args: argparse.Namespace) -> int:
    stored = store.get_sync(args.tenant, args.cursor)
    if stored is None:
        print(f"rlgw trajectories: no sample with cursor {args.cursor}", file=sys.stderr)
        return 1
    # The CLI can span tenants, so unlike the HTTP API it names the owner.
    sys.stdout.buffer.write(stored.to_json(with_tenant=True))
    return 0


def _export(store: Store, args: argparse.Namespace) -> int:
    from tqdm import tqdm

    if args.format == "parquet":
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError as exc:
            print(
                f"rlgw trajectories: parquet export needs pyarrow ({exc}); install rlgw's `parquet` "
                "extra: pip install -e '.[parquet]' in a checkout, or pip install 'pyarrow>=15'",
                file=sys.stderr,
            )
            return 2
    total = store.count_sync(args.tenant, after=args.after)
    samples = store.iter_sync(args.tenant, after=args.after, batch=EXPORT_BATCH)
    progress = tqdm(total=total, unit="sample", file=sys.stderr, mininterval=0.5, desc="export")
    if args.format == "jsonl":
        _export_jsonl(samples, args.out, progress)
    else:
        if args.out == "-":
            print("rlgw trajectories: parquet needs a file for --out", file=sys.stderr)
            return 2
        _export_parquet(samples, Path(args.out), progress)
    progress.close()
    print(f"exported {progress.n} samples to {args.out}", file=sys.stderr)
    return 0


def _export_jsonl(samples: Iterator[StoredSample], out: str, progress: Any) -> None:
    with contextlib.nullcontext(sys.stdout.buffer) if out == "-" else _atomic_file(Path(out)) as fh:
        for s in samples:
            fh.write(s.to_json(with_tenant=True))
            progress.update(1)


@contextlib.contextmanager
def _atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A file written under a temporary name and renamed when complete: no half-written exports."""
    tmp = path.with_name(f".{path.name}.partial")
    try:
        with open(tmp, "wb") as fh:
            yield fh
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _export_parquet(samples: Iterator[StoredSample], out: Path, progress: Any) -> None:
    import pyarrow.parquet as pq

    from rlgw.gateway.trajectories import parquet

    with _atomic_file(out) as fh, pq.ParquetWriter(fh, parquet.schema(), compression="zstd") as writer:
        while batch := list(itertools.islice(samples, EXPORT_BATCH)):
            writer.write_batch(parquet.record_batch(batch))
            progress.update(len(batch))
