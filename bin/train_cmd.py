"""`rlgw train`: the RL loop (rollouts through the gateway, train, sync weights) from a config file."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlgw.trainer.config import TrainConfig

EXAMPLE = """example (learns to answer with a given word on the tiny fixture, CPU, about a minute):
  rlgw train --config trainer/configs/word-tiny.json
  rlgw train --config cfg.json --dump-rollouts dumps/     # also write each iteration's samples (JSON lines)
  rlgw train --config cfg.json --replay dumps/            # train on dumps only: no gateway, no engine
  rlgw train --config trainer/configs/word-tiny-megatron.json --nproc-per-node 2   # Megatron, tp=2
  torchrun --nproc-per-node 2 -m rlgw.bin.main train --config trainer/configs/word-tiny-megatron.json
    (the same without the re-exec: tp * pp * dp of the config's `parallel` processes; rank 0 runs the
    loop, the gateway and the engine, the other ranks only train)
Console: one line per iteration (reward, tokens, losses, served version, time split) and warnings.
Receipts (one JSON line per iteration) go to WORK_DIR/receipts.jsonl and TensorBoard event files
(WORK_DIR/tensorboard; `tensorboard --logdir WORK_DIR/tensorboard`); every log line to WORK_DIR/train.log.
"""


def _to_console(record: logging.LogRecord) -> bool:
    # The trainer's own lines and every warning; a line per HTTP request (the openai SDK's and
    # httpx's loggers at INFO), per published version and so on would bury the iteration lines.
    return record.name.startswith("rlgw.trainer") or record.levelno >= logging.WARNING


def _route_logs(log_file: Path) -> None:
    """Keep the console to `_to_console`'s lines; every record at the run's level also goes to `log_file`."""
    from transformers.utils import logging as hf_logging

    from rlgw.logs import JsonFormatter

    root = logging.getLogger()
    for handler in root.handlers:
        handler.addFilter(_to_console)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(log_file)
    to_file.setFormatter(JsonFormatter())
    root.addHandler(to_file)
    hf_logging.disable_progress_bar()  # "Loading weights" bars from each model load


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `rlgw train`."""
    p = sub.add_parser(
        "train",
        help="run the RL loop: rollouts through the gateway -> train -> publish weights -> engines",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config", required=True, help="a JSON or TOML file (see rlgw.trainer.config.TrainConfig)"
    )
    p.add_argument("--model", default=None, help="override the config's model (a HF checkpoint directory)")
    p.add_argument("--work-dir", default=None, help="override the config's work_dir")
    p.add_argument("--iterations", type=int, default=None, help="override the config's iterations")
    p.add_argument("--seed", type=int, default=None, help="override the config's seed")
    p.add_argument("--lr", type=float, default=None, help="override the config's optim.lr")
    p.add_argument(
        "--dump-rollouts", default=None, metavar="DIR", help="write consumed samples per iteration"
    )
    p.add_argument("--replay", default=None, metavar="DIR", help="train on --dump-rollouts files only")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (summary lines only)")
    p.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        metavar="N",
        help="run under torchrun with N processes (the config's parallel tp * pp * dp)",
    )
    p.set_defaults(func=run)


def _exec_torchrun(nproc: int) -> None:
    """Replace this process by torchrun running this same command line on `nproc` processes."""
    import sys

    argv, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
        elif a == "--nproc-per-node":
            skip = True
        elif not a.startswith("--nproc-per-node="):
            argv.append(a)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "-m", "rlgw.bin.main", *argv]  # fmt: skip
    os.execv(sys.executable, cmd)


def _follow(cfg: TrainConfig) -> int:
    """A rank other than 0: build its piece of the trainer and do what rank 0 says until the run ends."""
    import torch

    from rlgw.trainer.loop import build_trainer

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    trainer = build_trainer(cfg)
    follow = getattr(trainer, "follow", None)
    if follow is None:
        raise SystemExit(
            f"rlgw train: trainer {cfg.trainer!r} runs on one process; launch it without torchrun"
        )
    follow()
    return 0


def run(args: argparse.Namespace) -> int:
    """Load and check the config, run the loop, print where the receipts are."""
    import asyncio
    import sys

    from pydantic import ValidationError

    from rlgw.trainer.config import TrainConfig
    from rlgw.trainer.loop import Loop

    try:
        cfg = TrainConfig.from_file(Path(args.config))
        overrides = {
            "model": args.model,
            "work_dir": args.work_dir,
            "iterations": args.iterations,
            "seed": args.seed,
        }
        cfg = cfg.model_copy(update={k: v for k, v in overrides.items() if v is not None})
        if args.lr is not None:
            cfg = cfg.model_copy(update={"optim": cfg.optim.model_copy(update={"lr": args.lr})})
        cfg = TrainConfig.model_validate(cfg.model_dump())
    except (OSError, ValueError, ValidationError) as e:
        print(f"rlgw train: bad config {args.config}: {e}", file=sys.stderr)
        return 2
    if args.nproc_per_node is not None and args.nproc_per_node != cfg.parallel.world:
        print(f"rlgw train: --nproc-per-node {args.nproc_per_node} but the config's parallel "
              f"{cfg.parallel.model_dump()} needs tp * pp * dp = {cfg.parallel.world}",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.nproc_per_node is not None and "RANK" not in os.environ:
        _exec_torchrun(args.nproc_per_node)
    if int(os.environ.get("RANK", "0")) != 0:
        return _follow(cfg)
    loop = Loop(
        cfg,
        progress=not args.no_progress,
        dump_dir=Path(args.dump_rollouts) if args.dump_rollouts else None,
        replay_dir=Path(args.replay) if args.replay else None,
    )
    _route_logs(Path(cfg.work_dir) / "train.log")
    receipts = asyncio.run(loop.run())
    print(f"rlgw train: {len(receipts)} iteration(s); receipts in {loop.receipts_path}")
    return 0
