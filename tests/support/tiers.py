"""The quick tier (`python -m pytest -m quick`): every test that starts no process, marked at collection.

No one marks a test quick by hand, so a new test lands in the right tier by what it does. A test is
quick unless it carries a heavy marker (`HEAVY`), or its module, or one of the fixtures it uses,
refers to something that starts a process. What starts one is found by reading the source: the
process APIs (`SPAWNERS`: subprocess, multiprocessing, Ray, Playwright's browser), and, by a
fixpoint over tests/support, every helper there that reaches one of them (`engine_server`, `stack`,
`cluster`, `gateway`, ...). The check is by name, so a same-named local only makes a test slower to
reach, never a process-starting test quick.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from pathlib import Path

import pytest

HEAVY = ("slow", "long", "gpu", "real_agent", "smollm2")
SPAWNERS = frozenset(
    {"subprocess", "Popen", "multiprocessing", "create_subprocess_exec", "create_subprocess_shell"}
    | {"ray", "playwright", "sync_playwright", "async_playwright"}
)
SUPPORT = Path(__file__).resolve().parent
# The suite's own plugins (this one, the reaper, the time bounds) are no helpers a test calls.
PLUGINS = ("tiers.py", "reaper.py", "timeouts.py")
HELPERS = frozenset(p.stem for p in SUPPORT.glob("*.py") if p.name not in PLUGINS)


def _code(tree: ast.AST) -> list[ast.AST]:
    """The nodes of `tree` outside annotations (a `subprocess.Popen` parameter type starts nothing)."""
    nodes, todo = [], [tree]
    while todo:
        node = todo.pop()
        nodes.append(node)
        for name, child in ast.iter_fields(node):
            if name in ("annotation", "returns"):
                continue
            todo += [c for c in (child if isinstance(child, list) else [child]) if isinstance(c, ast.AST)]
    return nodes


def _names(tree: ast.AST) -> set[str]:
    """The names `tree`'s code reads: bare names, imported names, spawner attributes (`asyncio.
    create_subprocess_exec`) and support helpers reached through their module (`procs.engine_server`)."""
    found: set[str] = set()
    for node in _code(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            if node.attr in SPAWNERS or (isinstance(node.value, ast.Name) and node.value.id in HELPERS):
                found.add(node.attr)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            found.update(alias.name.split(".")[0] for alias in node.names)
            found.update(alias.name for alias in node.names)
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module.split(".")[0])  # from subprocess import run
    return found


@functools.cache
def starters() -> frozenset[str]:
    """The names that start a process: `SPAWNERS`, and the tests/support definitions that reach one."""
    refs: dict[str, set[str]] = {}
    for path in (SUPPORT / f"{name}.py" for name in HELPERS):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                refs.setdefault(node.name, set()).update(_names(node))
    found = set(SPAWNERS)
    while grown := {name for name, used in refs.items() if name not in found and used & found}:
        found |= grown
    return frozenset(found)


@functools.cache
def _source_starts(source: str) -> bool:
    return bool(_names(ast.parse(source)) & starters())


def _module_starts(path: Path) -> bool:
    return _source_starts(path.read_text())


def _fixture_starts(func: object) -> bool:
    try:
        source = inspect.getsource(func)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return False  # a fixture of pytest's own (tmp_path, monkeypatch, ...)
    return _source_starts(textwrap.dedent(source))


def is_quick(item: pytest.Item) -> bool:
    """Whether `item` starts no process, through its module or its fixtures, and carries no heavy marker."""
    if any(item.get_closest_marker(name) for name in HEAVY):
        return False
    if _module_starts(Path(item.path)):
        return False
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info else ()
    return not any(_fixture_starts(d.func) for chain in defs for d in chain)


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every quick test `quick`; `-m quick` then selects them."""
    for item in items:
        if is_quick(item):
            item.add_marker(pytest.mark.quick)
