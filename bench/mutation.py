"""Mutation testing of the core modules: the score per module and every surviving mutant.

Each mutant is one small, realistic bug (a flipped comparison, `and`/`or` swapped, a negated
or dropped `if` check, an integer off by one, an arithmetic operator swapped, a call statement
dropped, a returned value replaced by None, a boolean flipped), made with `ast` on one module
of a copy of the repository, and run against the fast tests that cover that module. A mutant
is killed when a test fails (or the run exceeds its timeout); it survives when every test
passes. A survivor listed in `EXCUSED` (equivalent: it changes no behaviour), each with its
reason, is counted apart: the score per module is killed / (run - excused), the raw score
killed / run. The bugs seeded by
issue 15 that the generic operators cannot make (a check weakened, a key dropped from a digest,
a pragma changed) are added as `SEEDED` mutants, each run against its own tests; the first
failing test is printed.

Docstrings, f-strings (messages), logging calls and the statements that are only a logging
call, annotations, decorators and module-level UPPER_CASE constants (tuning knobs such as a
compression level) are never mutated.

Speed: one unmutated run per module under `coverage` records which tests execute each line;
a mutant then runs only those tests (stopping at the first failure), and a mutant on a line no
test executes survives without a run. By default every k-th mutant is run, 30 per module
(`--sample 0` runs them all: about 1050, some 90 minutes on the shared 2-core machine; the
sample about 14 with `--jobs 1`). Every module's tests run in process, `gateway/turns/lifecycle.py`'s
included (tests/gateway/turns/test_mutation_gaps_turn.py: the scope, the policy, the sampling
boundary, commit and journal replay); only some seeded bugs' tests start a gateway process.
A module none of whose tests exist at `--rev` is reported and skipped.

The repository is never touched: `--rev` (default HEAD) is exported with `git archive` into a
temporary directory, one copy per job, and tests run there with this interpreter and
`PYTHONPATH` pointing at the copy (subprocesses the tests start import the mutant too).
A forked child per mutant starts from a parent that already imported the heavy third-party
libraries, so a mutant costs its tests, not the interpreter start-up.

    python bench/mutation.py [--rev HEAD] [--jobs 2] [--module gateway/ledger/ledger.py ...]
                             [--no-seeded] [--list] [--sample N]
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import io
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Module -> the fast tests that cover it (files absent at the revision are skipped).
CORE: dict[str, list[str]] = {
    "gateway/sample.py": [
        "tests/gateway/test_sample_validation.py",
        "tests/gateway/test_mutation_gaps_sample.py",
        "tests/gateway/ledger/test_ledger.py",
        "tests/gateway/trajectories/test_store_edges.py",
    ],
    "gateway/ledger/ledger.py": [
        "tests/gateway/ledger/test_ledger.py",
        "tests/gateway/ledger/test_ledger_edges.py",
        "tests/gateway/ledger/test_history_rules.py",
        "tests/gateway/ledger/test_history_print.py",
        "tests/gateway/ledger/test_mutation_gaps_ledger.py",
    ],
    "gateway/model/render.py": [
        "tests/gateway/model/test_render_edges.py",
        "tests/gateway/model/test_render.py",
        "tests/gateway/model/test_mutation_gaps_render.py",
        "tests/gateway/model/test_increment_cache.py",
    ],
    "gateway/model/increment_cache.py": [
        "tests/gateway/model/test_increment_cache.py",
        "tests/gateway/model/test_render.py",
    ],
    "gateway/trajectories/store.py": [
        "tests/gateway/trajectories/test_store.py",
        "tests/gateway/trajectories/test_store_edges.py",
        "tests/gateway/trajectories/test_store_durability.py",
        "tests/gateway/trajectories/test_mutation_gaps_store.py",
    ],
    "sync/delta.py": [
        "tests/sync/test_delta.py",
        "tests/sync/test_delta_refusals.py",
        "tests/sync/test_delta_digest.py",
        "tests/sync/test_delta_gaps.py",
        "tests/sync/test_delta_wide_gaps.py",
        "tests/sync/test_delta_blocks.py",
        "tests/sync/test_durable_defaults.py",
    ],
    "sync/pull.py": [
        "tests/sync/test_pull.py",
        "tests/sync/test_pull_edges.py",
        "tests/sync/test_delta_digest.py",
        "tests/sync/test_pull_gaps.py",
        "tests/sync/test_durable_defaults.py",
    ],
    # In process: the scope, the policy, the sampling boundary, commit and journal replay.
    "gateway/turns/lifecycle.py": ["tests/gateway/turns/test_mutation_gaps_turn.py"],
}

# Modules whose tests also run them in subprocesses (a killed writer).
SUBPROCESS = {"gateway/trajectories/store.py"}


@dataclass(frozen=True, slots=True)
class Seed:
    """A bug from issue 15 as a text replacement, and the tests meant to catch it.

    `edits` lists `(module, old, new)` alternatives (the code moves between revisions); the
    first whose `old` text occurs exactly once is applied.
    """

    name: str
    edits: tuple[tuple[str, str, str], ...]
    tests: tuple[str, ...]


SEEDED: list[Seed] = [
    Seed(
        "validate_sample without its loss-mask length check",
        (
            (
                "gateway/sample.py",
                "if len(sample.loss_mask) != n or len(sample.rollout_log_probs) != n:",
                "if len(sample.rollout_log_probs) != n:",
            ),
        ),
        ("tests/gateway/test_sample_validation.py",),
    ),
    Seed(
        "validate_sample without its positive-logprob check",
        (("gateway/sample.py", " or np.any(lp > 1e-4)", ""),),
        ("tests/gateway/test_sample_validation.py",),
    ),
    Seed(
        "message digest ignores tool_call_id",
        (
            ("gateway/ledger/ledger.py", '("name", "tool_call_id")', '("name",)'),
            ("gateway/ledger/ledger.py", '"name", "tool_call_id", "tool_calls"', '"name", "tool_calls"'),
        ),
        ("tests/gateway/ledger/test_history_rules.py",),
    ),
    Seed(
        "an echoed turn matches when its tool-call ids are a subset of the minted ones",
        (
            (
                "gateway/ledger/ledger.py",
                'if sorted(tc.get("id", "") for tc in calls) != sorted(turn.tool_call_ids):',
                'if not {tc.get("id", "") for tc in calls} <= set(turn.tool_call_ids):',
            ),
            (
                "gateway/ledger/ledger.py",
                "return sorted(ids) == sorted(turn.tool_call_ids)",
                "return set(ids) <= set(turn.tool_call_ids)",
            ),
        ),
        ("tests/gateway/ledger/test_history_rules.py",),
    ),
    Seed(
        "context room off by one (context - prompt + 1)",
        tuple(
            (module, "profile.context_length - prompt_len\n", "profile.context_length - prompt_len + 1\n")
            for module in ("gateway/turns/lifecycle.py", "gateway/turns/messages.py")
        ),
        ("tests/gateway/test_context_boundary.py",),
    ),
    Seed(
        "SQLite synchronous=NORMAL instead of FULL",
        (("gateway/trajectories/store.py", "PRAGMA synchronous=FULL", "PRAGMA synchronous=NORMAL"),),
        ("tests/gateway/trajectories/test_store_durability.py",),
    ),
    Seed(
        "delta digest check after patching disabled",
        (("sync/delta.py", "if got != rec.digest:", "if False:"),),
        ("tests/sync/test_delta_digest.py", "tests/sync/test_delta.py"),
    ),
]

# Survivors that no test should kill, each with why, keyed by (module, mutation, source line):
# "equivalent: ..." changes no behaviour. They are still run: one that survives
# is counted apart (the score leaves it out; the raw score does not) and printed with its reason;
# one that is killed is printed too, since then its reason is wrong.
_LEVEL = "equivalent: a zstd compression level; the payload decodes to the same bytes"
EXCUSED: dict[tuple[str, str, str], str] = {
    ("gateway/turns/lifecycle.py", "0 -> 1", "tools: int = 0  # tools_digest of the request"): (
        "equivalent: only completions plans take the default, and a completions segment never "
        "compares tool digests (another surface is a mode switch first)"
    ),
    (
        "gateway/turns/lifecycle.py",
        "False -> True",
        "reasoning_forced: bool = False  # the generation prompt already opened a think block",
    ): "equivalent: only completions plans take the default, and completions never read it",
    ("gateway/turns/lifecycle.py", "drop if check", "if ledger is None:"): (
        "equivalent: the records of a session without a ledger carry no `invalidate` and no "
        "`commit` (both come from a ledger), so the rest of the function does nothing either"
    ),
    (
        "gateway/model/render.py",
        "True -> False",
        "with_tools = self._increment(probe, [tool], True, {}, anchor_user)",
    ): ("equivalent: both probe renders then keep the same closing in front; their comparison is unchanged"),
    (
        "gateway/model/render.py",
        "True -> False",
        "without = self._increment(probe, None, True, {}, anchor_user)",
    ): ("equivalent: both probe renders then keep the same closing in front; their comparison is unchanged"),
    (
        "gateway/model/render.py",
        "0 -> 1",
        "anchor = [_ANCHOR[1]] if anchor_user is None else [self._normalize_one(0, anchor_user), _ANCHOR[1]]",
    ): (
        "equivalent: the index only names a message in an error, and the anchor (a message the "
        "agent sent in an earlier turn) was normalized without one then"
    ),
    ("gateway/model/increment_cache.py", "return None", "return read"): (
        "equivalent: every read then raises TypeError (None is not callable) instead of ValueRead, which the "
        "placeholder render turns into the same outcome: the shape is not filled"
    ),
    (
        "gateway/model/increment_cache.py",
        "0 -> 1",
        "return found[0] if found[0] is not None and found[0] == found[1] else None",
    ): "equivalent: the two skeletons are equal whenever one is returned",
    (
        "gateway/model/increment_cache.py",
        "True -> False",
        "for slot, piece in zip(self.slots, self.pieces[1:], strict=True):",
    ): "equivalent: `re.split` with one group always gives one piece more than slots, so the lengths match",
    (
        "gateway/model/increment_cache.py",
        "4096 -> 4097",
        "def __init__(self, size: int = 4096, verify_every: int = 1000) -> None:",
    ): "equivalent: a bound on how many shapes are kept; a shape dropped is built again on its next use",
    ("gateway/model/render.py", "GtE -> Gt", 'closing = text[at + len(SENTINEL) :] if at >= 0 else ""'): (
        "equivalent: the anchor's user turn is rendered before the sentinel, which is never at offset 0"
    ),
    ("gateway/model/render.py", "0 -> 1", 'closing = text[at + len(SENTINEL) :] if at >= 0 else ""'): (
        "equivalent: the anchor's user turn is rendered before the sentinel, which is never at offset 0"
    ),
    ("gateway/sample.py", "Lt -> LtE", "if n <= 0 or len(sample.tokens) < n or len(sample.tokens) == n:"): (
        "equivalent: `< n or == n` and `<= n or == n` are the same test"
    ),
    (
        "gateway/ledger/ledger.py",
        "LtE -> Lt",
        "return _canonical_cached(arguments) if len(arguments) <= _CACHED_ARGUMENTS else "
        "_canonical(arguments)",
    ): "equivalent: cached or not, the same function; the bound only decides what is memoized",
    (
        "gateway/ledger/ledger.py",
        "1 -> 2",
        "seg.records.extend(_Record(role, digest, -1) for role, digest in records)",
    ): ("equivalent: -1 and -2 both mean 'not a generated turn' (only `turn >= 0` is ever tested)"),
    (
        "gateway/trajectories/store.py",
        "False -> True",
        "return cls(path, conn, _connect(path, readonly=False), readonly=False)",
    ): (
        "equivalent: the reader connection only runs SELECTs; opened read-only it reads the same "
        "committed rows (the writer has already put the file in WAL mode)"
    ),
    ("gateway/trajectories/store.py", "drop call statement", 'conn.execute("RELEASE finish")'): (
        "equivalent: savepoints of one name stack; ROLLBACK TO undoes the innermost (this finish's) "
        "and COMMIT releases them all"
    ),
    ("gateway/trajectories/store.py", "drop if check", "if not samples:"): (
        "equivalent: no samples insert no rows: an empty transaction, and the same `[]`"
    ),
    (
        "sync/delta.py",
        "1 -> 2",
        "new: NamedBytes, old: np.ndarray, base_digest: str, encoding: str, level: int = 1",
    ): _LEVEL,
    ("sync/delta.py", "1 -> 2", "level: int = 1,"): _LEVEL,
    ("sync/delta.py", "0 -> 1", 'payload, count, layout = b"".join(frames), 0, "dense"'): (
        "equivalent: `count` is read only for the sparse layout"
    ),
    ("sync/delta.py", "1 -> 2", "if self.reader.read(1):"): (
        "equivalent: any byte left means the payload is longer; reading two finds it as well"
    ),
}

# Imported once in the parent so that each forked mutant run skips them.
PRELOAD = (
    "numpy",
    "orjson",
    "xxhash",
    "zstandard",
    "pydantic",
    "jinja2",
    "tokenizers",
    "transformers",
    "torch",
    "safetensors",
    "httpx",
    "aiohttp",
    "starlette",
    "fastapi",
    "uvicorn",
    "openai",
    "pytest",
    "pytest_asyncio",
)

_LOG_NAMES = {"log", "logger", "logging", "warnings"}
_CMP_FLIP: dict[type, type] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_BIN_FLIP: dict[type, type] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Add,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.BitXor: ast.BitOr,
    ast.BitOr: ast.BitAnd,
    ast.BitAnd: ast.BitOr,
    ast.LShift: ast.RShift,
    ast.RShift: ast.LShift,
}


@dataclass(slots=True)
class Mutant:
    """One mutated version of a module."""

    module: str
    line: int
    what: str
    source: str
    tests: tuple[str, ...]
    code: str = ""  # the original source line
    stmt_line: int = 0  # first line of the enclosing statement (what coverage records)
    budget: float = 600.0  # seconds before its run is stopped (and counted as killed)
    seeded: bool = False
    outcome: str = ""  # killed | timeout | survived | error
    killer: str = ""


# -- generating mutants -------------------------------------------------------------------------


def _is_log_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    base = f.value if isinstance(f, ast.Attribute) else f
    return isinstance(base, ast.Name) and base.id in _LOG_NAMES


def _skipped(tree: ast.Module) -> set[int]:
    """ids of nodes never mutated: logging calls, f-strings, annotations, decorators, knobs."""
    roots: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            roots.append(node)
        elif _is_log_call(node):
            roots.append(node)
        elif isinstance(node, ast.Expr) and _is_log_call(node.value):
            roots.append(node)  # the statement too: dropping a log line changes no behaviour
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            roots.extend(node.decorator_list)
            if not isinstance(node, ast.ClassDef) and node.returns is not None:
                roots.append(node.returns)
        elif isinstance(node, ast.arg) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
    for stmt in tree.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and all(
            isinstance(t, ast.Name) and t.id.isupper() for t in targets
        ):
            roots.append(stmt)
    return {id(n) for r in roots for n in ast.walk(r)}


def _is_check(stmt: ast.If) -> bool:
    """An `if` whose body leaves early: a guard whose removal is a realistic dropped check."""
    last = stmt.body[-1]
    return isinstance(last, ast.Raise | ast.Return | ast.Continue | ast.Break)


def _sites(node: ast.AST, parent: ast.AST | None) -> Iterator[tuple[str, Callable[[], ast.AST | None]]]:
    """(description, apply) per mutation of `node`; `apply` mutates in place or returns a replacement."""
    if isinstance(node, ast.Compare):
        for j, op in enumerate(node.ops):
            if type(op) in _CMP_FLIP:
                new = _CMP_FLIP[type(op)]

                def flip(j: int = j, new: type = new) -> None:
                    node.ops[j] = new()

                yield f"{type(op).__name__} -> {new.__name__}", flip
    elif isinstance(node, ast.BoolOp):
        other = ast.Or if isinstance(node.op, ast.And) else ast.And

        def swap() -> None:
            node.op = other()

        yield f"{type(node.op).__name__} -> {other.__name__}", swap
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield "not x -> x", lambda: node.operand
    elif isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in _BIN_FLIP:
        new = _BIN_FLIP[type(node.op)]

        def arith(new: type = new) -> None:
            node.op = new()

        yield f"{type(node.op).__name__} -> {new.__name__}", arith
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        yield f"{node.value} -> {node.value + 1}", lambda: ast.Constant(node.value + 1)
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        yield f"{node.value} -> {not node.value}", lambda: ast.Constant(not node.value)
    elif isinstance(node, ast.If | ast.While | ast.IfExp):

        def negate() -> None:
            node.test = ast.UnaryOp(ast.Not(), node.test)

        yield "negate condition", negate
        if isinstance(node, ast.If) and _is_check(node):
            yield "drop if check", lambda: node.orelse or [ast.Pass()]
    elif isinstance(node, ast.Return) and node.value is not None:
        if not (isinstance(node.value, ast.Constant) and node.value.value is None):

            def none() -> None:
                node.value = ast.Constant(None)

            yield "return None", none
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call | ast.Await):
        yield "drop call statement", lambda: ast.Pass()


def _locations(tree: ast.AST) -> Iterator[tuple[ast.AST, ast.AST | None, str, int | None]]:
    """(node, parent, field, index in the field's list or None), depth first, deterministic."""
    stack: list[tuple[ast.AST, ast.AST | None, str, int | None]] = [(tree, None, "", None)]
    while stack:
        node, parent, fname, idx = stack.pop()
        yield node, parent, fname, idx
        children = []
        for f, value in ast.iter_fields(node):
            if isinstance(value, list):
                children += [(v, node, f, i) for i, v in enumerate(value) if isinstance(v, ast.AST)]
            elif isinstance(value, ast.AST):
                children.append((value, node, f, None))
        stack.extend(reversed(children))


def _statement_lines(tree: ast.AST) -> dict[int, int]:
    """id(node) -> first line of the innermost statement holding it."""
    out: dict[int, int] = {}

    def visit(node: ast.AST, line: int) -> None:
        if isinstance(node, ast.stmt):
            line = node.lineno
        out[id(node)] = line
        for child in ast.iter_child_nodes(node):
            visit(child, line)

    visit(tree, 0)
    return out


def _place(parent: ast.AST, fname: str, idx: int | None, new: ast.AST | list[ast.stmt]) -> None:
    if idx is None:
        setattr(parent, fname, new)
    else:
        seq = getattr(parent, fname)
        seq[idx : idx + 1] = new if isinstance(new, list) else [new]


def _docstring_ids(tree: ast.Module) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                out.add(id(body[0]))
    return out


def mutants_of(module: str, source: str, tests: tuple[str, ...]) -> list[Mutant]:
    """Every generic mutant of `source`, in source order."""
    tree = ast.parse(source)
    skip = _skipped(tree) | _docstring_ids(tree)
    stmt_lines = _statement_lines(tree)
    plan = []
    for k, (node, parent, _, _) in enumerate(_locations(tree)):
        if id(node) in skip or parent is None:
            continue
        for j, (what, _) in enumerate(_sites(node, parent)):
            plan.append((k, j, what, getattr(node, "lineno", 0), stmt_lines[id(node)]))
    lines = source.splitlines()
    normal = ast.unparse(tree)
    out = []
    for k, j, what, line, stmt_line in plan:
        fresh = ast.parse(source)
        node, parent, fname, idx = list(_locations(fresh))[k]
        _, apply = list(_sites(node, parent))[j]
        replacement = apply()
        if replacement is not None:
            _place(parent, fname, idx, replacement)
        ast.fix_missing_locations(fresh)
        text = ast.unparse(fresh)
        if text != normal:
            code = lines[line - 1].strip() if line else ""
            out.append(Mutant(module, line, what, text, tests, code, stmt_line))
    return out


def seeded_mutants(tree_dir: Path) -> list[Mutant]:
    """`SEEDED` bugs that apply at this revision, each run against its own tests."""
    out = []
    for seed in SEEDED:
        for module, old, new in seed.edits:
            path = tree_dir / module
            text = path.read_text() if path.exists() else ""
            if text.count(old) == 1:
                line = text[: text.index(old)].count("\n") + 1
                tests = tuple(t for t in seed.tests if (tree_dir / t).exists())
                if not tests:
                    print(f"seed without its tests at this revision (not run): {seed.name}")
                    break
                mutated = text.replace(old, new)
                out.append(Mutant(module, line, seed.name, mutated, tests, old.strip(), line, seeded=True))
                break
        else:
            print(f"seed not applicable here: {seed.name}")
    return out


# -- running them ----------------------------------------------------------------------------------


class _FirstFailure:
    """pytest plugin: write the node id of the first failing test to `path`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.done = False

    def pytest_runtest_logreport(self, report) -> None:
        if report.failed and not self.done:
            self.done = True
            Path(self.path).write_text(report.nodeid)


class _WhoRuns:
    """pytest plugin: which tests execute each line of `module` (coverage contexts are node ids).

    Written to `path` as JSON: the collection order, each test's seconds (under coverage, so an
    overestimate) and, per executed line, the node ids that ran it (none for lines run only at
    import: module-level code, defaults). Lines never run are absent.
    """

    def __init__(self, tree_dir: Path, module: str, path: str) -> None:
        import coverage

        self.path = path
        self.files = {str(tree_dir / module), str(tree_dir / "rlgw" / module)}
        self.cov = coverage.Coverage(data_file=None, include=sorted(self.files))
        self.cov.start()
        self.seconds: dict[str, float] = {}

    def pytest_runtest_setup(self, item) -> None:
        self.cov.switch_context(item.nodeid)

    def pytest_runtest_logreport(self, report) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self, session) -> None:
        self.cov.stop()
        data = self.cov.get_data()
        lines: dict[int, set[str]] = {}
        for name in data.measured_files():
            if name in self.files or os.path.realpath(name) in self.files:
                for line, contexts in data.contexts_by_lineno(name).items():
                    lines.setdefault(line, set()).update(c for c in contexts if c)
        doc = {
            "order": [i.nodeid for i in session.items],
            "lines": {k: sorted(v) for k, v in lines.items()},
            "seconds": self.seconds,
        }
        Path(self.path).write_text(json.dumps(doc))


def _child(tree_dir: Path, args: list[str], plugins: list[object]) -> None:
    """In the forked child: run pytest with `args` in `tree_dir` and exit with its status."""
    os.setpgid(0, 0)  # so that a timeout kills the servers the tests started as well
    os.chdir(tree_dir)
    sys.path.insert(0, str(tree_dir))
    sys.dont_write_bytecode = True
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    import pytest

    args = ["-q", "-p", "no:cacheprovider", "-o", "addopts=", "--no-header", *args]
    with contextlib.redirect_stdout(io.StringIO()):
        code = pytest.main(args, plugins=plugins)
    os._exit(int(code))


def run_tests(
    tree_dir: Path, tests: tuple[str, ...], timeout: float, *, cover: str = ""
) -> tuple[str, float, str]:
    """(outcome, seconds, first failing test) of `tests` against the files now in `tree_dir`.

    The outcome is the mutant's: "survived" when every test passed. `cover="module:path"` runs
    every test (no `-x`) and writes who runs each line of the module to path (`_WhoRuns`).
    """
    note = tempfile.mktemp(prefix="rlgw-mut-")
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            if cover:
                module, _, path = cover.partition(":")
                plugins: list[object] = [_FirstFailure(note), _WhoRuns(tree_dir, module, path)]
                _child(tree_dir, list(tests), plugins)
            _child(tree_dir, ["-x", *tests], [_FirstFailure(note)])
        finally:
            os._exit(3)
    status: int | None = None
    while time.monotonic() - t0 < timeout:
        done, code = os.waitpid(pid, os.WNOHANG)
        if done:
            status = code
            break
        time.sleep(0.02)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    seconds = time.monotonic() - t0
    killer = ""
    with contextlib.suppress(FileNotFoundError):
        killer = Path(note).read_text()
        os.unlink(note)
    if status is None:
        return "timeout", seconds, killer
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return "survived", seconds, killer
    if code in (1, 2) or code < 0:
        # 2: a mutant broke collection (an import-time error); < 0: the run crashed on a signal.
        return "killed", seconds, killer or f"pytest exit {code}"
    return "error", seconds, killer or f"pytest exit {code}"


def select_tests(m: Mutant, who: dict) -> tuple[str, ...] | None:
    """The tests that run the mutated statement, in collection order.

    All of the module's tests for import-time code (every test depends on it) and for modules in
    `SUBPROCESS` (their tests may run it where coverage does not look); None when no test runs it.
    """
    ids = who["lines"].get(str(m.stmt_line))
    if ids is None and m.module not in SUBPROCESS and who["order"]:
        return None
    if not ids:
        return m.tests
    return tuple(n for n in who["order"] if n in ids)


def export(rev: str, dest: Path) -> str:
    """`git archive` of `rev` into `dest`; returns the full commit hash."""
    commit = subprocess.check_output(["git", "-C", str(REPO), "rev-parse", rev], text=True).strip()
    dest.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(REPO), "archive", commit], stdout=subprocess.PIPE)
    subprocess.check_call(["tar", "-x", "-C", str(dest)], stdin=archive.stdout)
    if archive.wait() != 0:
        raise SystemExit(f"git archive {rev} failed")
    return commit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", default="HEAD", help="the commit to mutate (default HEAD)")
    ap.add_argument("--module", action="append", help="only these modules (repeatable)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--no-seeded", action="store_true", help="skip the seeded bugs of issue 15")
    ap.add_argument("--list", action="store_true", help="only count and list the mutants")
    ap.add_argument(
        "--sample",
        type=int,
        default=30,
        help="run every k-th mutant, N per module (default 30; 0: all of them, about 90 min here)",
    )
    ns = ap.parse_args()

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    work = Path(tempfile.mkdtemp(prefix="rlgw-mutation-"))
    try:
        trees = [work / f"tree{j}" for j in range(max(1, ns.jobs))]
        commit = export(ns.rev, trees[0])
        for t in trees[1:]:
            shutil.copytree(trees[0], t, symlinks=True)
        print(f"mutating {commit} ({ns.rev}) in {work}, {len(trees)} job(s)")

        modules = [m for m in (ns.module or CORE) if (trees[0] / m).exists()]
        mutants: list[Mutant] = []
        generated: dict[str, int] = {}
        for module in modules:
            tests = tuple(t for t in CORE.get(module, []) if (trees[0] / t).exists())
            if not tests:
                # pytest with no path would run the whole suite.
                print(f"{module}: not measured, none of its tests exist at this revision")
                continue
            found = mutants_of(module, (trees[0] / module).read_text(), tests)
            generated[module] = len(found)
            if ns.sample:
                found = found[:: max(1, len(found) // ns.sample)][: ns.sample]
            mutants += found
            print(f"{module}: {len(found)} mutants, tests: {' '.join(tests)}")
        if not ns.no_seeded:
            mutants += seeded_mutants(trees[0])
        if ns.list:
            for m in mutants:
                print(f"  {m.module}:{m.line} {m.what}")
            return

        for name in PRELOAD:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
        os.environ["PYTHONPATH"] = str(trees[0])
        # Each module's tests must pass on the unmutated copy; that run (under coverage when it is
        # installed) also says which tests run each line, and its time sets the mutant timeout.
        for module in dict.fromkeys(m.module for m in mutants if not m.seeded):
            mine = [m for m in mutants if m.module == module and not m.seeded]
            who_path = str(work / f"who-{module.replace('/', '-')}.json")
            cover = f"{module}:{who_path}" if importlib.util.find_spec("coverage") else ""
            outcome, seconds, killer = run_tests(trees[0], mine[0].tests, 1200, cover=cover)
            if outcome != "survived":
                print(f"{module}: not measured, its tests fail unmutated ({killer})")
                mutants = [m for m in mutants if m not in mine]
                continue
            who = json.loads(Path(who_path).read_text()) if cover else {"lines": {}, "order": []}
            for m in mine:
                selected = select_tests(m, who)
                if selected is None:
                    m.outcome, m.killer = "survived", "(no test runs this line)"
                elif selected == m.tests:
                    m.budget = max(60.0, 3 * seconds)
                else:
                    # An infinite loop is the usual timeout: stop at a few times what the tests need.
                    need = sum(who["seconds"].get(t, 1.0) for t in selected)
                    m.tests, m.budget = selected, 20.0 + 3 * need
            print(f"unmutated: the tests of {module} pass in {seconds:.1f}s")
        for tests in dict.fromkeys(m.tests for m in mutants if m.seeded):
            outcome, seconds, killer = run_tests(trees[0], tests, 1200)
            for m in mutants:
                if m.seeded and m.tests == tests:
                    if outcome == "survived":
                        m.budget = max(60.0, 3 * seconds)
                    else:
                        m.outcome, m.killer = "not run", f"(its tests fail unmutated: {killer})"

        t0 = time.monotonic()
        results: mp.Queue = mp.Queue()
        todo = [m for m in mutants if not m.outcome]
        shares = [todo[j :: len(trees)] for j in range(len(trees))]
        procs = []
        for j, tree_dir in enumerate(trees):
            env_tree = str(tree_dir)
            proc = mp.get_context("fork").Process(target=_run_share, args=(env_tree, shares[j], results, j))
            proc.start()
            procs.append(proc)
        done = 0
        while done < len(todo):
            j, i, outcome, killer = results.get()
            m = shares[j][i]
            m.outcome, m.killer = outcome, killer
            if outcome == "survived" and (m.module, m.what, m.code) in EXCUSED:
                m.outcome = "excused"
            done += 1
            if m.outcome in ("survived", "error"):
                print(f"  {outcome}: {m.module}:{m.line} {m.what}: {m.code}", flush=True)
            if done % 25 == 0 or done == len(todo):
                print(f"  {done}/{len(todo)} mutants run ({time.monotonic() - t0:.0f}s)", flush=True)
        for proc in procs:
            proc.join()
        report(commit, mutants, generated, time.monotonic() - t0)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_share(tree: str, share: list[Mutant], results: mp.Queue, j: int) -> None:
    """One job: run its share of mutants in its own copy of the tree."""
    os.environ["PYTHONPATH"] = tree
    tree_dir = Path(tree)
    for i, m in enumerate(share):
        path = tree_dir / m.module
        original = path.read_text()
        path.write_text(m.source)
        try:
            outcome, _, killer = run_tests(tree_dir, m.tests, m.budget)
        finally:
            path.write_text(original)
        results.put((j, i, outcome, killer))


def report(commit: str, mutants: list[Mutant], generated: dict[str, int], seconds: float) -> None:
    """The score per module, the seeded bugs and who killed them, and every survivor.

    `score` leaves the `EXCUSED` survivors out (killed / (run - excused)); `raw` counts them.
    """
    print(f"\nmutation score at {commit[:12]} ({seconds / 60:.1f} min)")
    head = ("of", "run", "killed", "timeout", "survived", "excused", "score", "raw")
    print(f"{'module':<22} " + " ".join(f"{h:>8}" for h in head))
    total: Counter[str] = Counter()
    for module in dict.fromkeys(m.module for m in mutants if not m.seeded):
        c = Counter(m.outcome for m in mutants if m.module == module and not m.seeded)
        total.update(c)
        _row(module, generated.get(module, 0), c)
    if total:
        _row("all", sum(generated.values()), total)
    seeded = [m for m in mutants if m.seeded]
    if seeded:
        print("\nseeded bugs (issue 15):")
        for m in seeded:
            by = f" by {m.killer}" if m.killer else ""
            print(f"  {m.outcome:<8} {m.what} [{m.module}:{m.line}]{by}")
    plain = [m for m in mutants if not m.seeded]
    excused = [m for m in plain if m.outcome == "excused"]
    if excused:
        print("\nexcused survivors (EXCUSED):")
        for m in excused:
            print(f"  {m.module}:{m.line} {m.what}: {m.code}\n      {EXCUSED[m.module, m.what, m.code]}")
    wrong = [m for m in plain if m.outcome in ("killed", "timeout") and (m.module, m.what, m.code) in EXCUSED]
    if wrong:
        print("\nkilled although EXCUSED says no test should (its reason is wrong):")
        for m in wrong:
            print(f"  {m.module}:{m.line} {m.what}: {m.code} by {m.killer}")
    survivors = [m for m in plain if m.outcome in ("survived", "error")]
    if survivors:
        print("\nsurviving mutants:")
        for m in survivors:
            why = f" {m.killer}" if m.killer else ""
            print(f"  {m.module}:{m.line} {m.what}: {m.code}{why}")


def _row(name: str, of: int, c: Counter[str]) -> None:
    n = sum(c.values())
    dead = c["killed"] + c["timeout"]
    score = 100 * dead / (n - c["excused"]) if n > c["excused"] else 0.0
    raw = 100 * dead / n if n else 0.0
    cells = (of, n, c["killed"], c["timeout"], c["survived"] + c["error"], c["excused"])
    print(f"{name:<22} " + " ".join(f"{v:>8}" for v in cells) + f" {score:>7.1f}% {raw:>7.1f}%")


if __name__ == "__main__":
    main()
