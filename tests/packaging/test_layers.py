"""The gateway's rooms import one way, as docs/ARCHITECTURE.md's table of rooms says.

The table is read from the document itself, so the rules have one home: a room's row names the rooms
it may import. Every import a gateway module makes is checked, lazy ones inside functions included,
since they couple the rooms just the same.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = ROOT / "gateway"
BASE = {
    "content",
    "engine_semantics",
    "errors",
    "ids",
    "metrics",
    "sample",
}  # the modules at gateway/'s top that every room may use
PREFIX = "rlgw.gateway."


def room_rules() -> dict[str, set[str]]:
    """Each room's allowed imports, from the document's "may import" column."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("## The gateway's rooms", 1)[1].split("\n## ", 1)[0]
    rules: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in {"room", "---"}:
            continue
        room = cells[0].strip("`").rstrip("/").removesuffix(".py")
        may = cells[2]
        if may == "everything":
            rules[room] = {"*"}
        else:
            rules[room] = {"base"} if "base" in may else set()
            rules[room] |= {m.rstrip("/") for m in re.findall(r"`([a-z_]+)/`", may)}
    return rules


def web_free_rooms() -> set[str]:
    """The rooms the document says know no HTTP."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    line = text.split("Rooms that know no HTTP import neither `fastapi` nor `starlette`:", 1)[1].split(
        ".\n", 1
    )[0]
    return {"base" if r.strip() == "base" else r.strip().strip("`").rstrip("/") for r in line.split(",")}


def module_name(path: Path) -> str:
    """The dotted name under rlgw.gateway of a file in gateway/ (a package is its __init__)."""
    parts = path.relative_to(GATEWAY).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room_of(module: str) -> str:
    """The room a gateway module belongs to: base, app, or its top folder."""
    head = module.split(".")[0]
    if module in BASE:
        return "base"
    return head or "gateway"


def resolve(node: ast.ImportFrom | ast.Import) -> list[str]:
    """The gateway modules an import statement loads (names under rlgw.gateway, without the prefix)."""
    found = []
    if isinstance(node, ast.Import):
        found = [a.name for a in node.names]
    elif node.module and node.level == 0:
        for alias in node.names:
            # `from rlgw.gateway.tenancy import limits` loads the module tenancy.limits.
            sub = f"{node.module}.{alias.name}".removeprefix(PREFIX).replace(".", "/")
            is_module = (GATEWAY / f"{sub}.py").exists() or (GATEWAY / sub / "__init__.py").exists()
            found.append(f"{node.module}.{alias.name}" if is_module else node.module)
    return [m.removeprefix(PREFIX) for m in found if m.startswith(PREFIX)]


def gateway_imports() -> list[tuple[str, str, int]]:
    """(importer, imported, line) for every import of a gateway module inside gateway/."""
    edges = []
    for path in sorted(GATEWAY.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                edges += [(module_name(path), target, node.lineno) for target in resolve(node)]
    return edges


def test_the_table_names_every_room() -> None:
    rules = room_rules()
    folders = {p.name for p in GATEWAY.iterdir() if (p / "__init__.py").exists()}
    loose = {p.stem for p in GATEWAY.glob("*.py")} - {"__init__"}
    assert set(rules) == folders | {"base", "app"}, "a room without a row, or a row without a room"
    assert loose == BASE | {"app"}, "a module at gateway/'s top that is neither base nor app.py"
    for room, allowed in rules.items():
        assert allowed <= set(rules) | {"*"}, f"{room} may import a room that does not exist"


def violations() -> list[tuple[str, str, str]]:
    """Imports the rules forbid: (importer, imported, why), the pending ones included."""
    rules = room_rules()
    bad = []
    for importer, target, line in gateway_imports():
        src, dst = room_of(importer), room_of(target)
        where = f"gateway/{importer.replace('.', '/')}.py:{line}"
        if dst == "gateway":
            continue  # the package's docstring only
        if dst == "app" and src != "app":
            bad.append((importer, target, f"{where}: only app.py is the composition root"))
        elif src != dst and "*" not in rules[src] and dst not in rules[src]:
            bad.append((importer, target, f"{where}: {src} may not import {dst}"))
        elif src == dst == "surfaces":
            # One API's folder never imports another's; what they share is at surfaces/'s top.
            a, b = importer.split("."), target.split(".")
            if len(a) > 2 and len(b) > 2 and a[1] != b[1]:
                bad.append((importer, target, f"{where}: surface {a[1]} imports surface {b[1]}"))
    return bad


def test_every_gateway_import_follows_the_rooms_rules() -> None:
    assert gateway_imports(), "no imports found: the reader is broken"
    found = violations()
    assert not found, "\n".join(why for *_, why in found)


def test_the_gateway_imports_nothing_of_rlgw_outside_it() -> None:
    outside = []
    for path in sorted(GATEWAY.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            outside += [
                f"{path}: {n}" for n in names if n.startswith("rlgw.") and not n.startswith("rlgw.gateway")
            ]
    assert not outside, outside


def test_rooms_without_http_import_no_web_framework() -> None:
    rooms = web_free_rooms()
    assert {"base", "ledger", "turns"} <= rooms, rooms  # the document's sentence was read
    found = []
    for path in sorted(GATEWAY.rglob("*.py")):
        if room_of(module_name(path)) not in rooms:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [
                f"{path}:{node.lineno} {n}" for n in names if n.split(".")[0] in {"fastapi", "starlette"}
            ]
    assert not found, found


def _rlgw_imports(folder: str) -> set[str]:
    """The rlgw packages a top-level folder's modules import (lazy imports included)."""
    found = set()
    for path in sorted((ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            found |= {".".join(n.split(".")[:2]) for n in names if n.startswith("rlgw.")}
    return found


def test_the_engine_and_sync_import_nothing_of_each_other() -> None:
    assert "rlgw.sync" not in _rlgw_imports("engine")
    assert "rlgw.engine" not in _rlgw_imports("sync")
