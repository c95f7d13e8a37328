"""Generate reference/cli.md from the `rlgw` argparse parser: every subcommand and option."""

from __future__ import annotations

import argparse

import mkdocs_gen_files

from rlgw.bin.main import build_parser


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _flags(action: argparse.Action) -> str:
    names = action.option_strings or [action.metavar or action.dest]
    shown = ", ".join(f"`{n}`" for n in names)
    if action.option_strings and action.nargs != 0:
        metavar = action.metavar or (
            "{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest.upper()
        )
        shown += f" `{metavar if isinstance(metavar, str) else ' '.join(metavar)}`"
    return shown


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or action.required:
        return ""
    return f"`{action.default}`"


def _section(parser: argparse.ArgumentParser, path: list[str], out: list[str]) -> None:
    """One heading per (sub)command: its usage, description and option table, then its subcommands."""
    level = "#" * min(len(path) + 1, 4)
    out += [f"{level} `{' '.join(path)}`", ""]
    if parser.description:
        out += [parser.description, ""]
    out += ["```text", parser.format_usage().removeprefix("usage: ").strip(), "```", ""]
    actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    subs = [a for a in actions if isinstance(a, argparse._SubParsersAction)]
    rows = [a for a in actions if a not in subs]
    if rows:
        out += ["| option | default | meaning |", "| --- | --- | --- |"]
        out += [f"| {_flags(a)} | {_cell(_default(a))} | {_cell(a.help or '')} |" for a in rows]
        out.append("")
    if parser.epilog:
        out += ["```text", parser.epilog.strip(), "```", ""]
    for sub in subs:
        helps = {c.dest: c.help for c in sub._choices_actions}
        for name, child in sub.choices.items():
            if not child.description and helps.get(name):
                child.description = helps[name]
            _section(child, [*path, name], out)


def render() -> str:
    """The whole CLI reference page."""
    out = [
        "# Command line",
        "",
        "Generated at build time from the argparse parser (`bin/main.py` and `bin/*_cmd.py`);"
        " `rlgw COMMAND --help` prints the same.",
        "",
    ]
    _section(build_parser(), ["rlgw"], out)
    return "\n".join(out)


with mkdocs_gen_files.open("reference/cli.md", "w") as f:
    f.write(render())
