"""Generate reference/metrics.md from the gateway's Prometheus registry: name, type, labels, help."""

from __future__ import annotations

import mkdocs_gen_files
from prometheus_client.metrics import MetricWrapperBase

import rlgw.gateway.app  # noqa: F401  (imports every module that defines a metric)
from rlgw.gateway.metrics import REGISTRY, OpenSessionsCollector


def _rows() -> list[tuple[str, str, str, str]]:
    """(name, type, labels, help) of every rlgw metric, the scrape-time collector's included."""
    rows = []
    # The metric objects keep their label names; a family collected before any labelled child
    # exists would not show them.
    for collector in list(REGISTRY._collector_to_names):
        if isinstance(collector, MetricWrapperBase):
            name = collector._name + ("_total" if collector._type == "counter" else "")
            rows.append((name, collector._type, ", ".join(collector._labelnames), collector._documentation))
    for family in OpenSessionsCollector({"tenant": 1}).collect():
        labels = ", ".join(family.samples[0].labels)
        rows.append((family.name, family.type, labels, family.documentation))
    return sorted(rows)


def render() -> str:
    """The metrics reference page."""
    out = [
        "# Prometheus metrics",
        "",
        "`GET /metrics` (Prometheus text format; it needs the admin key when one is set). Generated at"
        " build time from the gateway's registry (`gateway/metrics.py`). Histograms add `_bucket`, `_sum`"
        " and `_count`."
        " The process also exports Prometheus' standard `process_*`, `python_info` and `python_gc_*` series.",
        "",
        "| metric | type | labels | meaning |",
        "| --- | --- | --- | --- |",
    ]
    out += [f"| `{n}` | {t} | {labels or '—'} | {h} |" for n, t, labels, h in _rows()]
    return "\n".join(out) + "\n"


with mkdocs_gen_files.open("reference/metrics.md", "w") as f:
    f.write(render())
