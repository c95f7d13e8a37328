"""The README and the docs say what the code does (issue 38): every repository path they name exists, every
`rlgw ...` command line they show parses with the real parser, the README's quickstart is the tested file, and
the generated references have a meaning for every CLI option and config field."""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from rlgw.bin.main import build_parser
from rlgw.trainer.config import TrainConfig
from tests.support.procs import REPO

_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
# Words that start with a top-level entry of the repository and name a file or folder in it.
_TOP_LEVEL = {p.name for p in REPO.iterdir() if not p.name.startswith(".") or p.name == ".ci"} - {
    "site",
    "build",
    "dist",
}
_SHELL = {"", "bash", "sh", "shell", "console"}
_SEPARATORS = {"&&", "||", "|", ";", "&"}


def _documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def _prose(text: str) -> str:
    return _FENCE.sub("", text)


def _shell_lines(text: str) -> Iterator[str]:
    """Each command line of the shell blocks, continuation lines joined."""
    for lang, body in _FENCE.findall(text):
        if lang in _SHELL:
            yield from body.replace("\\\n", " ").splitlines()


def _path_candidates(text: str) -> Iterator[str]:
    words = [w for span in _CODE_SPAN.findall(_prose(text)) for w in span.split()]
    words += [w for line in _shell_lines(text) for w in line.split()]
    for word in words:
        word = word.strip("'\"()[],;").split("::")[0]
        if any(c in word for c in "<>*{}$…") or "..." in word:
            continue  # a placeholder or a pattern, not a path
        word = re.sub(r":\d+$", "", word).rstrip(".:")
        head = word.split("/")[0]
        if head in _TOP_LEVEL and ("/" in word or (head == word and "." in word)):
            yield word


def _module_candidates(text: str) -> Iterator[str]:
    for span in _CODE_SPAN.findall(_prose(text)):
        for word in re.findall(r"(?<![\w+.-])rlgw(?:\.\w+)+", span):
            if word.rsplit(".", 1)[-1] not in ("yaml", "json", "toml", "py", "md"):
                yield word
        if m := re.match(r"python -m (bench\.\w+)", span):
            yield m[1]


def _generated_pages() -> set[str]:
    """The pages docs/gen/ writes at build time, relative to docs/."""
    return {
        name
        for script in (REPO / "docs" / "gen").glob("*.py")
        for name in re.findall(r'mkdocs_gen_files\.open\("([^"]+)"', script.read_text())
    }


def _link_exists(doc: Path, target: str) -> bool:
    """A file of the repository, or (from a docs page: the site has it) a page docs/gen/ writes."""
    path, docs = (doc.parent / target).resolve(), (REPO / "docs").resolve()
    on_site = doc.resolve().is_relative_to(docs) and path.is_relative_to(docs)
    return path.exists() or (on_site and str(path.relative_to(docs)) in _generated_pages())


def test_every_repository_path_in_the_docs_exists() -> None:
    missing = []
    for doc in _documents():
        text = doc.read_text()
        for word in set(_path_candidates(text)):
            if not (REPO / word).exists():
                missing.append(f"{doc.relative_to(REPO)}: {word}")
        for target in set(_LINK.findall(_prose(text))):
            target = target.split("#")[0]
            if target and "://" not in target and not _link_exists(doc, target):
                missing.append(f"{doc.relative_to(REPO)}: link {target}")
    assert missing == [], "the docs name paths that do not exist:\n" + "\n".join(sorted(missing))


def _top_level_names(module: Path) -> set[str]:
    tree = ast.parse(module.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _resolves(dotted: str) -> bool:
    """`dotted` names a module of the repository, or a name defined at the top of one. Read statically:
    the integrations' modules import their trainers, which the test environment does not install."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:cut])
        module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if module.is_file():
            return len(parts) == cut or parts[cut] in _top_level_names(module)
    return False


def test_every_module_the_docs_name_imports() -> None:
    named = {(doc, m) for doc in _documents() for m in _module_candidates(doc.read_text())}
    bad = sorted(f"{doc.relative_to(REPO)}: {m}" for doc, m in named if not _resolves(m))
    assert bad == [], "the docs name modules or objects that do not exist:\n" + "\n".join(bad)


def _rlgw_commands(line: str) -> Iterator[list[str]]:
    """The argument lists of the `rlgw` commands in one shell line (after any VAR=value prefix)."""
    words = shlex.split(line, comments=True)
    command: list[str] = []
    for word in [*words, ";"]:
        if word not in _SEPARATORS:
            command.append(word)
            continue
        while command and re.match(r"^[A-Z_][A-Z0-9_]*=", command[0]):
            command.pop(0)
        if command[:1] == ["rlgw"]:
            yield command[1:]
        command = []


def _parse_error(args: list[str]) -> str | None:
    if "..." in args:  # arguments left out on purpose: check what it names
        return _mention_error([a for a in args if a != "..."])
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.suppress(SystemExit):
        build_parser().parse_args(args)
        return None
    return err.getvalue().strip().splitlines()[-1]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(
        (a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)),
        {},
    )


def _mention_error(words: list[str]) -> str | None:
    """An inline mention (`rlgw serve --cache-mib`): its subcommands exist and it names only their options."""
    parser = build_parser()
    rest = list(words)
    while rest and rest[0] in _subparsers(parser):
        parser = _subparsers(parser)[rest.pop(0)]
    if rest and _subparsers(parser) and not rest[0].startswith("-"):
        # `rlgw trajectories list|show|export` names alternatives
        unknown = [c for c in rest[0].split("|") if c not in _subparsers(parser)]
        if unknown or len(rest) > 1:
            return f"no subcommand {rest[0]!r} of {parser.prog!r}"
        return None
    options = {s for a in parser._actions for s in a.option_strings}
    unknown = [w.split("=")[0] for w in rest if w.startswith("--") and w.split("=")[0] not in options]
    return f"{parser.prog} has no {unknown}" if unknown else None


def test_every_rlgw_command_line_in_the_docs_parses() -> None:
    """Shell blocks must parse whole; inline mentions must name real subcommands and options. The examples in
    the CLI's own epilogs (the CLI reference shows them) must parse too."""
    bad, seen = [], 0
    for parser in _all_parsers(build_parser()):
        for line in (parser.epilog or "").replace("\\\n", " ").splitlines():
            if not re.match(r"([A-Z_][A-Z0-9_]*=\S*\s+)*rlgw\s", line.strip()):
                continue  # the epilog's prose
            for args in _rlgw_commands(line.strip()):
                seen += 1
                if error := _parse_error(args):
                    bad.append(f"{parser.prog} --help: rlgw {shlex.join(args)}: {error}")
    for doc in _documents():
        text = doc.read_text()
        for line in _shell_lines(text):
            for args in _rlgw_commands(line):
                seen += 1
                if error := _parse_error(args):
                    bad.append(f"{doc.relative_to(REPO)}: rlgw {shlex.join(args)}: {error}")
        for span in _CODE_SPAN.findall(_prose(text)):
            if span.startswith("rlgw "):
                seen += 1
                words = [w for w in span.split()[1:] if w != "..."]
                if error := _mention_error(words):
                    bad.append(f"{doc.relative_to(REPO)}: `{span}`: {error}")
    assert seen > 50, "the command extraction found almost nothing: is it still reading the docs?"
    assert bad == [], "command lines in the docs that the CLI rejects:\n" + "\n".join(bad)


def test_the_readme_quickstart_is_the_tested_file() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1]
    shown = re.search(r"```python\n(.*?)```", section, re.S)[1]
    assert shown == (REPO / "examples" / "quickstart.py").read_text()
    page = (REPO / "docs" / "getting-started" / "quickstart.md").read_text()
    assert '--8<-- "examples/quickstart.py"' in page


def _all_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for child in _subparsers(parser).values():
        yield from _all_parsers(child)


def test_every_cli_option_has_help_text() -> None:
    missing = [
        f"{p.prog} {'/'.join(a.option_strings) or a.dest}"
        for p in _all_parsers(build_parser())
        for a in p._actions
        if not isinstance(a, argparse._SubParsersAction) and not (a.help or "").strip()
    ]
    assert missing == [], "options without help text (the CLI reference shows it):\n" + "\n".join(missing)


def _models(annotation: object) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in getattr(annotation, "__args__", ()):
        yield from _models(arg)


def test_every_config_field_has_a_description() -> None:
    missing, queue, seen = [], [TrainConfig], set()
    while queue:
        model = queue.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, info in model.model_fields.items():
            if not (info.description or "").strip():
                missing.append(f"{model.__name__}.{name}")
            queue.extend(_models(info.annotation))
    assert len(seen) > 5
    assert missing == [], (
        "config fields without a description (the config reference shows it):\n" + "\n".join(missing)
    )
