"""What the viewer's training page shows: a `rlgw train` run's receipts as per-iteration charts.

`rlgw train` appends one JSON receipt per iteration to WORK_DIR/receipts.jsonl (`trainer/loop.py`); the
viewer is pointed at that file (`rlgw trajectories view --receipts PATH`) and reads it on every request,
so a page opened during a run shows the iterations written so far. A last line without its newline is a
receipt being written and is left out; any other line that is not a receipt is an error the page names.

Charts are plain data here (the series, and each point's place in a fixed-size SVG box), computed from the
receipts' own fields: reward, KL, clip fraction, IS ratio, staleness and the rollout/train/sync time split.
This module knows nothing about HTTP or HTML (`routes.py` and `static/training.html` own those) and only
reads the file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WIDTH, HEIGHT = 440, 170  # the SVG box of one chart
LEFT, RIGHT, TOP, BOTTOM = 52, 10, 10, 24  # margins for the axis labels
BOX = {"width": WIDTH, "height": HEIGHT, "left": LEFT, "right": RIGHT, "top": TOP, "bottom": BOTTOM}
COLOURS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea")

Getter = Callable[[dict[str, Any]], Any]


class ReceiptsError(ValueError):
    """The receipts file is missing or holds a line that is not a receipt."""


def load_receipts(path: Path) -> list[dict[str, Any]]:
    """The receipts in `path`, in file order (a trailing partial line, still being written, left out)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ReceiptsError(f"cannot read {path}: {exc.strerror or exc}") from None
    lines = text.split("\n")
    if lines and lines[-1] and not text.endswith("\n"):
        lines.pop()  # appended without its newline yet: the writer is mid-line
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ReceiptsError(f"{path} line {n} is not JSON ({exc.msg})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("iteration"), int):
            raise ReceiptsError(f"{path} line {n} is not a receipt (no integer 'iteration')")
        out.append(doc)
    return out


@dataclass(frozen=True, slots=True)
class Point:
    """One value of a series at one iteration, and where it is drawn."""

    iteration: int
    value: float
    x: float
    y: float


@dataclass(frozen=True, slots=True)
class Bar:
    """One stacked bar piece: a series' value at one iteration, drawn from `y` down `height`."""

    iteration: int
    value: float
    x: float
    y: float
    width: float
    height: float


@dataclass(frozen=True, slots=True)
class Series:
    """One named line (or stack layer) of a chart; iterations without a value are left out."""

    key: str
    colour: str
    points: list[Point]
    bars: list[Bar]

    @property
    def polyline(self) -> str:
        """The SVG `points` attribute of the line."""
        return " ".join(f"{p.x:.1f},{p.y:.1f}" for p in self.points)


@dataclass(frozen=True, slots=True)
class Chart:
    """One chart: a title, its series, the y range shown, and the note shown when it has no data."""

    key: str
    title: str
    series: list[Series]
    y_min: float
    y_max: float
    stacked: bool
    first_iteration: int
    last_iteration: int

    @property
    def empty(self) -> bool:
        """True when no receipt holds a value for any of its series."""
        return not any(s.points for s in self.series)


@dataclass(frozen=True, slots=True)
class _Spec:
    key: str
    title: str
    series: tuple[tuple[str, Getter], ...]
    stacked: bool = False
    floor: float | None = 0.0  # the y axis starts here unless a value is lower (None: the data's minimum)


def _top(name: str) -> Getter:
    return lambda r: r.get(name)


def _loss(name: str) -> Getter:
    return lambda r: (r.get("losses") or {}).get(name)


def _seconds(name: str) -> Getter:
    return lambda r: (r.get("seconds") or {}).get(name)


SPECS = (
    _Spec("reward", "reward (mean over rollouts)", (("mean", _top("reward_mean")),)),
    _Spec("kl", "KL", (("kl", _top("kl")),)),
    _Spec("clipfrac", "clip fraction", (("clipfrac", _loss("clipfrac")),)),
    _Spec(
        "is_ratio",
        "IS ratio (trainer / engine, mean)",
        (("is_ratio_mean", _top("is_ratio_mean")),),
        floor=None,
    ),
    _Spec("staleness", "staleness (versions behind, max)", (("max_staleness", _top("max_staleness")),)),
    _Spec(
        "time",
        "time per iteration (s)",
        (("rollout", _seconds("rollout")), ("train", _seconds("train")), ("sync", _seconds("sync"))),
        stacked=True,
    ),
)


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _chart(spec: _Spec, receipts: list[dict[str, Any]]) -> Chart:
    its = [r["iteration"] for r in receipts]
    first, last = (min(its), max(its)) if its else (0, 0)
    raw = [[(r["iteration"], _number(get(r))) for r in receipts] for _, get in spec.series]
    values = [v for col in raw for _, v in col if v is not None]
    if spec.stacked:
        totals: dict[int, float] = {}
        for col in raw:
            for it, v in col:
                totals[it] = totals.get(it, 0.0) + (v or 0.0)
        values = list(totals.values())
    lo = min(values, default=0.0)
    lo = lo if spec.floor is None else min(lo, spec.floor)
    hi = max(values, default=1.0)
    if hi - lo < 1e-9:  # a flat series: a unit-wide band around it
        lo, hi = lo - 0.5, hi + 0.5
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    span = max(last - first, 1)
    slot = plot_w / (span + 1)

    def x(it: int) -> float:
        return LEFT + slot / 2 + (it - first) * (plot_w - slot) / span if span else LEFT + plot_w / 2

    def y(v: float) -> float:
        return TOP + (hi - v) / (hi - lo) * plot_h

    series = []
    base: dict[int, float] = {}
    for (key, _), col, colour in zip(spec.series, raw, COLOURS, strict=False):
        points, bars = [], []
        for it, v in col:
            if v is None:
                continue
            points.append(Point(it, v, x(it), y(v)))
            if spec.stacked:
                under = base.get(it, 0.0)
                top = y(under + v)
                bars.append(Bar(it, v, x(it) - slot * 0.4, top, slot * 0.8, y(under) - top))
                base[it] = under + v
        series.append(Series(key, colour, points, bars))
    return Chart(spec.key, spec.title, series, lo, hi, spec.stacked, first, last)


def charts(receipts: list[dict[str, Any]]) -> list[Chart]:
    """The training page's charts, one per metric, over the iterations of `receipts`."""
    return [_chart(spec, receipts) for spec in SPECS]


def series_json(receipts: list[dict[str, Any]]) -> dict[str, Any]:
    """The charts' values as JSON: iterations, and per chart per series one value (or null) each."""
    out: dict[str, Any] = {"iterations": [r["iteration"] for r in receipts], "charts": {}}
    for spec in SPECS:
        out["charts"][spec.key] = {key: [_number(get(r)) for r in receipts] for key, get in spec.series}
    return out
