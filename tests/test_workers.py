"""The workers' units (tests/support/workers.py): what goes whole to one worker, and in what order."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support import workers

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("nodeid", "expected"),
    [
        ("tests/sglang/test_sglang_scenarios.py::test_x[a]", (0, "engines")),
        ("tests/vllm/test_vllm_abort.py::test_y", (0, "engines")),
        ("tests/scaffolds/test_real_clis.py::test_codex", (1, "agents")),
        ("tests/scaffolds/test_locks.py::test_z", (2, "tests/scaffolds/test_locks.py")),
        ("tests/gateway/test_e2e.py::TestA::test_b[x::y]", (2, "tests/gateway/test_e2e.py")),
    ],
)
def test_a_test_belongs_to_its_tier_or_else_its_module(nodeid: str, expected: tuple[int, str]) -> None:
    assert workers.unit(nodeid) == expected


def test_every_shared_unit_names_modules_that_exist() -> None:
    """A renamed tier or module would silently fall back to one unit per module (servers per worker)."""
    for _, prefixes in workers.SHARED:
        for prefix in prefixes:
            path = ROOT / prefix
            assert path.is_dir() if prefix.endswith("/") else path.is_file(), prefix


def test_shared_units_are_handed_out_first_the_rest_keep_their_order() -> None:
    ids = [
        "tests/engine/test_a.py::t",
        "tests/vllm/test_v.py::t",
        "tests/gateway/test_b.py::t",
        "tests/scaffolds/test_real_clis.py::t",
        "tests/sglang/test_s.py::t",
    ]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    workers.pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == [
        "tests/vllm/test_v.py::t",
        "tests/sglang/test_s.py::t",
        "tests/scaffolds/test_real_clis.py::t",
        "tests/engine/test_a.py::t",
        "tests/gateway/test_b.py::t",
    ]


@pytest.mark.parametrize(
    ("args", "one_process"),
    [
        (["tests/gateway/test_e2e.py::test_x"], True),
        (["tests"], False),
        (["tests/a.py::t", "tests/b.py"], False),
    ],
)
def test_a_run_that_names_tests_stays_in_one_process(args: list[str], one_process: bool) -> None:
    n = workers.pytest_xdist_auto_num_workers(SimpleNamespace(args=args))  # type: ignore[arg-type]
    assert (n == 0) == one_process and n <= workers.MAX_WORKERS
