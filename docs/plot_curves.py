"""Learning curves from `rlgw train` receipts: each run's mean reward per iteration, printed and in one PNG.

    python docs/plot_curves.py --out docs/tool-task-curves.png --title "..." seed0=W0/receipts.jsonl seed1=...

Each RUN is LABEL=PATH to a run's WORK_DIR/receipts.jsonl; the figure has the mean reward per iteration (one
line per run) and the goal's two thresholds (first iteration below 0.2, last two above 0.8). Needs matplotlib
(the `dev` extra).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def rewards(path: Path) -> list[float]:
    """The mean reward of each iteration in a receipts file, in order."""
    receipts = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["reward_mean"] for r in sorted(receipts, key=lambda r: r["iteration"])]


def main() -> None:
    """Print the curves and write the PNG."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="LABEL=PATH to a receipts.jsonl")
    p.add_argument("--out", type=Path, required=True, help="the PNG to write")
    p.add_argument("--title", default="mean reward per iteration")
    args = p.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for run in args.runs:
        label, _, path = run.partition("=")
        ys = rewards(Path(path))
        print(f"{label}: " + " ".join(f"{y:.2f}" for y in ys))
        ax.plot(range(len(ys)), ys, marker="o", markersize=3, label=label)
    ax.axhline(0.8, color="#16a34a", linestyle="--", linewidth=1, label="goal: last two above 0.8")
    ax.axhline(0.2, color="#dc2626", linestyle=":", linewidth=1, label="goal: first below 0.2")
    ax.set_xlabel("iteration")
    ax.set_ylabel("mean reward")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(args.title, fontsize=10)
    ax.legend(fontsize=8, loc="center right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
