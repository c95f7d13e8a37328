"""Generate reference/sample.md from the code: the sample's fields, statuses, reject reasons, segment causes
and history policies (`gateway/sample.py`, `gateway/ledger/ledger.py`), each with the comment beside it."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re

import mkdocs_gen_files

from rlgw.gateway.ledger.ledger import Cause, Policy
from rlgw.gateway.sample import RejectReason, Sample, SampleStatus, VersionSpan

_MEMBER = re.compile(r"^\s+(\w+)\s*[:=][^#]*#\s*(.+)$")


def _comments(cls: type) -> dict[str, str]:
    """The trailing comment of each member line in `cls`'s source (`NAME = ...  # meaning`)."""
    return {m[1]: m[2] for line in inspect.getsource(cls).splitlines() if (m := _MEMBER.match(line))}


def _doc(cls: type) -> str:
    return " ".join((cls.__doc__ or "").split())


def _fields(cls: type) -> list[str]:
    notes = _comments(cls)
    out = ["| field | type | meaning |", "| --- | --- | --- |"]
    for f in dataclasses.fields(cls):
        kind = str(f.type).replace("|", "or")
        out.append(f"| `{f.name}` | `{kind}` | {notes.get(f.name, '')} |")
    return [*out, ""]


def _values(cls: type[enum.Enum]) -> list[str]:
    notes = _comments(cls)
    out = ["| value | meaning |", "| --- | --- |"]
    out += [f"| `{m.value}` | {notes.get(m.name, '')} |" for m in cls]
    return [*out, ""]


def render() -> str:
    """The sample contract's reference page."""
    out = [
        "# Sample contract",
        "",
        "What leaves the gateway for a trainer: one sample per ledger segment, validated at `finish`."
        " Generated at build time from `gateway/sample.py` and `gateway/ledger/ledger.py`; `Sample.to_dict`"
        " gives these names (slime's where one exists) on `/v1/trajectories`, `rlgw trajectories export`"
        " and the client.",
        "",
        "## Sample",
        "",
        _doc(Sample),
        "",
        *_fields(Sample),
        "## Weight-version span",
        "",
        _doc(VersionSpan),
        "",
        *_fields(VersionSpan),
        "## Status",
        "",
        _doc(SampleStatus),
        "",
        "Values: " + ", ".join(f"`{m.value}`" for m in SampleStatus) + ".",
        "",
        "## Reject reasons",
        "",
        _doc(RejectReason) + " A rejected segment is not stored; `rlgw_sample_rejects_total` counts it.",
        "",
        *_values(RejectReason),
        "## Segment causes",
        "",
        _doc(Cause) + " Samples' `metadata.segment_cause` and the finish summary's `segment_causes` hold it.",
        "",
        *_values(Cause),
        "## History policies",
        "",
        _doc(Policy) + " A session's `policy` picks one; policies act only when a turn commits.",
        "",
        *_values(Policy),
    ]
    return "\n".join(out)


with mkdocs_gen_files.open("reference/sample.md", "w") as f:
    f.write(render())
