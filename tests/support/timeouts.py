"""Per-test time bounds on top of pytest-timeout: a budget by marker, and a separate one for setup.

pytest-timeout's ini `timeout` (pyproject) is the budget of an unmarked test. A marked test gets the
largest budget among its markers (`BUDGETS`), and a test under an engine tier's directory
(`ENGINE_TIERS`) at least `ENGINE_BUDGET`. An explicit `@pytest.mark.timeout(...)` wins over both.

Setup is timed apart from the test body: the first test that asks for a session-scoped server pays its
start (an engine, a vLLM venv build, a PostgreSQL cluster), so setup gets `max(budget, SETUP_FLOOR)`
and the timer restarts with the test's own budget once setup is done. A hang in either still fails,
naming the test, within minutes.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest
from pytest_timeout import Settings, _get_item_settings, get_env_settings

# Seconds per marker; a test with several gets the largest.
BUDGETS = {"slow": 900, "gpu": 900, "real_agent": 1800, "long": 3600}
# Real-engine tiers: vLLM and SGLang servers start in minutes on CPU.
ENGINE_TIERS = ("vllm", "sglang")
ENGINE_BUDGET = 1800
# The least any setup gets: a slow shared server's first start must not fail a quick test.
SETUP_FLOOR = 900

TESTS = Path(__file__).resolve().parents[1]


def budget(item: pytest.Item, default: float) -> float:
    """The seconds `item`'s body may run: `default` raised by its markers and its engine tier."""
    seconds = max([default, *(s for name, s in BUDGETS.items() if item.get_closest_marker(name))])
    path = Path(item.path).resolve()
    if path.is_relative_to(TESTS) and path.relative_to(TESTS).parts[0] in ENGINE_TIERS:
        seconds = max(seconds, ENGINE_BUDGET)
    return seconds


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give each test without its own `timeout` mark the budget of its markers."""
    default = get_env_settings(config).timeout  # ini, PYTEST_TIMEOUT or --timeout
    if not default or default <= 0:
        return  # timeouts switched off (`--timeout=0`, e.g. under a debugger)
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(budget(item, default)))


def _restart(item: pytest.Item, seconds: float) -> None:
    hooks = item.config.pluginmanager.hook
    settings = _get_item_settings(item)
    hooks.pytest_timeout_cancel_timer(item=item)
    hooks.pytest_timeout_set_timer(item=item, settings=Settings(seconds, *settings[1:]))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    """Time setup with `SETUP_FLOOR` at least, then restart the timer with the test's own budget."""
    settings = _get_item_settings(item)
    timed = settings.timeout is not None and settings.timeout > 0 and not settings.func_only
    if timed:
        _restart(item, max(settings.timeout, SETUP_FLOOR))
    yield
    if timed:
        _restart(item, settings.timeout)
