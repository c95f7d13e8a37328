"""The quick tier (`python -m pytest -m quick`): every test that starts no process, marked at collection.

No one marks a test quick by hand, so a new test lands in the right tier by what it does. A test is
quick unless it carries a heavy marker (`HEAVY`), or its function, or one of the fixtures it uses,
reads a name that starts a process. What starts one is found by reading the source: the process
APIs (`SPAWNERS`: subprocess, multiprocessing, Ray, Playwright's browser), the package's own
starters (`PACKAGE_SPAWNERS`), every helper in tests/support that reaches one (`engine_server`,
`stack`, `cluster`, `gateway`, ...: a fixpoint, so a new helper counts without being listed), and
the test module's own functions that reach one. The check is by name, so a same-named local only
keeps a test out of the quick tier, never lets a process-starting test in.
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
# The suite's own plugins (this one, the reaper, the time bounds, the workers' units) are no helpers
# a test calls.
PLUGINS = ("tiers.py", "reaper.py", "timeouts.py", "workers.py")
HELPERS = frozenset(p.stem for p in SUPPORT.glob("*.py") if p.name not in PLUGINS)
# The package's own process starters a test may call directly (by name: the package is not read, its
# names collide across modules).
PACKAGE_SPAWNERS = frozenset({"local_services", "embedded_engine", "LocalSandbox"})


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
            # The object imported (`from tests.support.e2e import stack`), and a process API anywhere
            # in the path (`import torch.multiprocessing`, `from subprocess import run`).
            module = (getattr(node, "module", None) or "").split(".")
            for alias in node.names:
                found.add(alias.name.split(".")[0] if isinstance(node, ast.Import) else alias.name)
                found.update(SPAWNERS.intersection([*module, *alias.name.split(".")]))
    return found


def _defs(tree: ast.Module) -> dict[str, set[str]]:
    """Each top-level function and class of a module, with the names it reads."""
    return {
        node.name: _names(node)
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }


def _closure(refs: dict[str, set[str]], seed: frozenset[str]) -> frozenset[str]:
    """`seed` plus every definition in `refs` that reads one of them, transitively."""
    found = set(seed)
    while grown := {name for name, used in refs.items() if name not in found and used & found}:
        found |= grown
    return frozenset(found)


@functools.cache
def starters() -> frozenset[str]:
    """`SPAWNERS`, `PACKAGE_SPAWNERS` and the definitions in tests/support that reach one."""
    refs: dict[str, set[str]] = {}
    for path in (SUPPORT / f"{name}.py" for name in HELPERS):
        for name, used in _defs(ast.parse(path.read_text())).items():
            refs.setdefault(name, set()).update(used)
    return _closure(refs, SPAWNERS | PACKAGE_SPAWNERS)


@functools.cache
def module_starters(path: Path) -> frozenset[str]:
    """What starts a process as seen from the module at `path`: its own definitions shadow others'."""
    tree = ast.parse(path.read_text())
    refs = _defs(tree)
    seed = starters() - refs.keys()
    for node in ast.walk(tree):  # `import multiprocessing as mp`: `mp` starts processes here
        if isinstance(node, ast.Import | ast.ImportFrom):
            module = set((getattr(node, "module", None) or "").split("."))
            seed |= {
                alias.asname
                for alias in node.names
                if alias.asname and ((module | set(alias.name.split("."))) & SPAWNERS or alias.name in seed)
            }
    return _closure(refs, frozenset(seed))


def starts_process(func: object) -> bool:
    """Whether the function `func` (a test or a fixture) reads a name that starts a process."""
    try:
        source, path = inspect.getsource(func), inspect.getfile(func)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return False  # a fixture of pytest's own (tmp_path, monkeypatch, ...)
    return bool(_names(ast.parse(textwrap.dedent(source))) & module_starters(Path(path)))


def is_quick(item: pytest.Item) -> bool:
    """Whether `item` starts no process, through its module or its fixtures, and carries no heavy marker."""
    if any(item.get_closest_marker(name) for name in HEAVY):
        return False
    if starts_process(getattr(item, "function", None)):
        return False
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info else ()
    return not any(starts_process(d.func) for chain in defs for d in chain)


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every quick test `quick`; `-m quick` then selects them."""
    for item in items:
        if is_quick(item):
            item.add_marker(pytest.mark.quick)
