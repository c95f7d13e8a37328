"""Runs on more cores (pytest-xdist, opt in): workers take whole units of tests, heaviest first.

A unit is one test module, so a module-scoped server (an engine, a gateway stack) starts once, on the
worker that runs the module. The tiers whose modules share package-scoped servers are one unit each
(`SHARED`): the real engines' tiers (SGLang, then vLLM) and the real agents' runs start their servers
once in the whole run, not once per worker. Those units go first, so the long ones never start last and leave
the other workers idle.

`-n auto --dist loadscope --no-loadscope-reorder` turns it on, and `pytest_xdist_make_scheduler` makes
the scope a unit (xdist's `loadgroup` marks would do it, but pytest 9.2 ignores the node id suffix they
rely on). The number of workers is the machine's cores, at most `MAX_WORKERS` (each runs its own engines:
memory, not cores, bounds more). A run that names tests (`path::test`) runs in one process. The default run
stays in one process (docs/development/testing.md says why).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

MAX_WORKERS = 4
# Units that span modules, first to last: (name, paths of the modules that share its servers).
# The two engine tiers are one unit: their servers busy-poll while idle (SGLang's scheduler about half
# a core, vLLM's worker a third), so side by side each would slow the other's tests down.
SHARED = (
    ("engines", ("tests/sglang/", "tests/vllm/")),
    (
        "agents",
        tuple(
            f"tests/scaffolds/test_{m}.py"
            for m in ("real_clis", "real_harnesses", "real_terminus", "real_openhands", "ray", "run_installs")
        ),
    ),
)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """No workers for a run that names tests; else one per core, at most `MAX_WORKERS`."""
    if config.args and all("::" in arg for arg in config.args):
        return 0
    return max(1, min(len(os.sched_getaffinity(0)), MAX_WORKERS))


def unit(nodeid: str) -> tuple[int, str]:
    """(rank, name) of a test's unit: a `SHARED` tier by its place, else its module (ranked after)."""
    module = nodeid.split("::", 1)[0]
    for rank, (name, prefixes) in enumerate(SHARED):
        if module.startswith(prefixes):
            return rank, name
    return len(SHARED), module


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduling (each unit to one worker, whole), with `unit` as the scope."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit(nodeid)[1]

    return UnitScheduling(config, log)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The shared units first (the scheduler hands out units in this order), the rest as collected."""
    items.sort(key=lambda item: unit(item.nodeid)[0])
