"""Where a run's receipts go besides `receipts.jsonl`: the console line, TensorBoard and Weights & Biases.

Each iteration's receipt becomes one console line (`summary_line`) and one set of scalars
(`scalars`: reward, tokens, losses, trainer/engine agreement, staleness, the time split), written to
TensorBoard event files (`torch.utils.tensorboard`, under WORK_DIR/tensorboard) and, when configured,
to a W&B run (offline by default: files under WORK_DIR/wandb, `wandb sync` uploads them later). This
module knows nothing about training; it only reads receipts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class WandbSettings:
    """A W&B run: `mode` "offline" writes files only; "online" needs a logged-in `wandb`."""

    project: str
    name: str | None = None
    mode: str = "offline"


def scalars(r: dict[str, Any]) -> dict[str, float]:
    """The receipt's numbers as flat `group/name` scalars (absent values left out)."""
    out: dict[str, float | None] = {
        "reward/mean": r["reward_mean"],
        "reward/std": r["reward_std"],
        "data/rollouts": r["rollouts"],
        "data/samples": r["samples"],
        "data/trainable_tokens": r["trainable_tokens"],
        "data/failed_runs": r["failed_runs"],
        "staleness/max": r["max_staleness"],
        "staleness/tokens_masked": r["stale_tokens_masked"],
        "engine/logprob_gap_max": r["logprob_gap_max"],
        "engine/is_ratio_mean": r["is_ratio_mean"],
        "sync/version": (r["published"] or {}).get("version"),
    }
    out.update({f"loss/{k}": v for k, v in r["losses"].items()})
    out.update({f"time/{k}_s": v for k, v in r["seconds"].items()})
    return {k: float(v) for k, v in out.items() if v is not None}


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def summary_line(r: dict[str, Any]) -> str:
    """One console line per iteration: reward, tokens, losses, served version, time split, and a
    warning when the engine ignores seeds (the run is not repeatable)."""
    pub = r["published"] or {}
    served = ",".join(pub.get("served_versions") or []) or "-"
    loss, s = r["losses"], r["seconds"]
    kl = f"  kl {_fmt(loss['kl'], '.4f')}" if "kl" in loss else ""
    return (
        f"it {r['iteration']:>3}  reward {_fmt(r['reward_mean'])}±{_fmt(r['reward_std'])}  "
        f"rollouts {r['rollouts']}  tokens {r['trainable_tokens']}  "
        f"pg {_fmt(loss.get('pg_loss'), '+.4f')}{kl}  clip {_fmt(loss.get('clipfrac'), '.2f')}  "
        f"ratio {_fmt(r['is_ratio_mean'], '.4f')}  gap {_fmt(r['logprob_gap_max'], '.1e')}  "
        f"grad {_fmt(loss.get('grad_norm'))}  served v{served}  "
        f"time rollout {s['rollout']:.1f}s train {s['train']:.1f}s sync {s['sync']:.1f}s"
        + ("  NOT REPEATABLE: the engine ignores sampling seeds" if r.get("not_repeatable") else "")
    )


class Trackers:
    """The configured sinks for receipts; `log` each one, `close` at the end of the run."""

    def __init__(
        self, work_dir: Path, *, tensorboard: bool, wandb: WandbSettings | None, config: dict[str, Any]
    ) -> None:
        self._tb = self._wandb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:  # torch's writer needs the `tensorboard` package
                raise RuntimeError(
                    "tracking.tensorboard needs the tensorboard package: pip install tensorboard "
                    "(or set tracking.tensorboard to false)"
                ) from e
            self._tb = SummaryWriter(log_dir=str(work_dir / "tensorboard"))
        if wandb is not None:
            try:
                import wandb as wb
            except ImportError as e:
                raise RuntimeError("tracking.wandb needs the wandb package: pip install wandb") from e
            self._wandb = wb.init(
                project=wandb.project,
                name=wandb.name,
                mode=wandb.mode,
                dir=str(work_dir),
                config=config,
                # the console is the iteration lines': no stream wrapping, no run summary printed
                settings=wb.Settings(console="off", silent=True),
            )

    def log(self, receipt: dict[str, Any]) -> None:
        """Write one iteration's scalars to every sink (flushed, so a crash loses nothing logged)."""
        values = scalars(receipt)
        step = int(receipt["iteration"])
        if self._tb is not None:
            for k, v in values.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(values, step=step)

    def close(self) -> None:
        """Close the event files and finish the W&B run."""
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            import wandb as wb

            self._wandb.finish()
            # finish() can return before the service process has written the run's records (seen
            # with wandb 0.31): teardown waits for it, so the files are complete when we return.
            wb.teardown()
