"""Tool-call formats: what one `<tool_call>...</tool_call>` block means, and which format a template uses.

Formats (SGLang's detectors, `docs/SGLANG_PROTOCOL.md` §4):

- ``hermes``: ``<tool_call>{json}</tool_call>``; the JSON may be a list of calls, and the last
  block may be left unterminated when generation stops.
- ``qwen25`` (alias ``qwen``): ``<tool_call>\\n{json}\\n</tool_call>``; same JSON as hermes, but an
  unterminated block is not a call.
- ``qwen3_coder``: ``<tool_call><function=NAME><parameter=KEY>value</parameter>...</function></tool_call>``,
  each value converted by the tool's JSON schema.

A call's JSON is ``{"name": ..., "arguments": {...}}`` (``parameters`` is accepted for
``arguments``); arguments are re-serialized with ``json.dumps(ensure_ascii=False)``.

Where we deliberately differ from SGLang (nothing the model wrote is dropped quietly):

- A call to a tool not in ``tools`` is kept as a call and flagged ``unknown_tool`` (SGLang drops it
  unless ``SGLANG_FORWARD_UNKNOWN_TOOLS`` is set): the agent's own dispatcher answers it, which is
  the signal the policy learns from.
- A block that is not a call (bad JSON, no name, arguments not an object, malformed
  ``<parameter=``) is returned whole, markers included, as content, and flagged. One bad item in
  a hermes list, or one bad function in a qwen3_coder block, turns the whole block into content.
- qwen3_coder values that do not fit their schema type stay strings and are flagged
  ``bad_value`` (SGLang turns a non-boolean into ``false``); parameters absent from the schema
  stay strings and are flagged ``unknown_parameter``.

This module knows nothing about streaming, reasoning or where blocks start and end in the
output; `output_parser` finds the blocks and calls `parse_block`.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"

TOOL_FORMATS = ("hermes", "qwen25", "qwen3_coder")
_ALIASES = {"qwen": "qwen25"}

# Error kinds. The first four turn the block into content; the rest keep the call.
INVALID_JSON = "invalid_json"  # hermes/qwen25 JSON does not parse
BAD_CALL = "bad_call"  # parses, but is not a call: not an object, no string name, no <function=NAME>
BAD_ARGUMENTS = "bad_arguments"  # arguments are not a JSON object
UNTERMINATED = "unterminated"  # no </tool_call> before the end of generation
UNKNOWN_TOOL = "unknown_tool"  # the name is not among the request's tools (call kept)
UNKNOWN_PARAMETER = "unknown_parameter"  # qwen3_coder parameter not in the schema (kept as a string)
BAD_VALUE = "bad_value"  # qwen3_coder value does not fit its schema type (kept as a string)


@dataclass(slots=True)
class ToolCall:
    """One parsed call; `arguments` is a JSON object serialized with ``ensure_ascii=False``."""

    index: int
    name: str
    arguments: str


@dataclass(slots=True)
class ParseError:
    """A problem with one tool-call block, recorded in the sample's metadata.

    `raw` is the whole block as the model wrote it, markers included.
    """

    kind: str
    detail: str
    raw: str


@dataclass(slots=True)
class BlockParse:
    """The outcome of one block: `calls` as (name, arguments JSON) pairs, or none if `ok` is False."""

    ok: bool
    calls: list[tuple[str, str]] = field(default_factory=list)
    errors: list[ParseError] = field(default_factory=list)


def normalize_tool_format(name: str | None) -> str | None:
    """The canonical format name for `name` (``qwen`` -> ``qwen25``); ValueError if unknown."""
    if name is None:
        return None
    name = _ALIASES.get(name, name)
    if name not in TOOL_FORMATS:
        raise ValueError(f"unknown tool-call format {name!r}; expected one of {', '.join(TOOL_FORMATS)}")
    return name


_QWEN25_HINT = re.compile(r'<tool_call>(?:\\n|\n)\s*\{\s*\\?"name')


def detect_tool_format(chat_template: str | None) -> str | None:
    """Guess the tool-call format a chat template teaches the model, or None if it has no tools.

    ``<function=`` (Qwen3-Coder's XML) -> ``qwen3_coder``; ``<tool_call>`` followed by a newline
    and ``{"name"`` (the Qwen2.5/Qwen3 instructions) -> ``qwen25``; any other ``<tool_call>`` ->
    ``hermes``. The newline may appear as a real newline or as a ``\\n`` escape in the Jinja source.
    """
    if not chat_template:
        return None
    if "<function=" in chat_template:
        return "qwen3_coder"
    if TOOL_CALL_START not in chat_template:
        return None
    return "qwen25" if _QWEN25_HINT.search(chat_template) else "hermes"


def tool_schemas(tools: list[dict] | None) -> dict[str, dict]:
    """Map each tool name to its parameter properties (``{}`` when it declares none).

    Accepts OpenAI tools (``{"type": "function", "function": {"name", "parameters"}}``) and the bare
    function form (``{"name", "parameters"}``).
    """
    out: dict[str, dict] = {}
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters")
        if isinstance(params, dict):
            props = params.get("properties", params if "type" not in params else {})
            out[fn["name"]] = props if isinstance(props, dict) else {}
        else:
            out[fn["name"]] = {}
    return out


def parse_block(fmt: str, block: str, schemas: dict[str, dict], *, terminated: bool) -> BlockParse:
    """Parse the text between ``<tool_call>`` and ``</tool_call>`` (`block`, markers excluded).

    `terminated` is False when generation ended inside the block: only hermes accepts that (if the
    text is already a complete call); otherwise the result is an ``unterminated`` error.
    """
    raw = TOOL_CALL_START + block + (TOOL_CALL_END if terminated else "")
    if not terminated and fmt != "hermes":
        return BlockParse(False, errors=[ParseError(UNTERMINATED, "generation ended inside the block", raw)])
    if fmt == "qwen3_coder":
        result = _parse_xml(block, schemas, raw)
    else:
        result = _parse_json(block, schemas, raw)
    if not terminated and not result.ok:
        detail = "; ".join(e.detail for e in result.errors)
        result.errors = [ParseError(UNTERMINATED, f"generation ended inside the block ({detail})", raw)]
    return result


# `json.dumps(value, ensure_ascii=False)` builds this encoder on every call (a non-default option).
_dumps = json.JSONEncoder(ensure_ascii=False).encode


def _parse_json(block: str, schemas: dict[str, dict], raw: str) -> BlockParse:
    try:
        value = json.loads(block)
    except ValueError as e:
        return BlockParse(False, errors=[ParseError(INVALID_JSON, str(e), raw)])
    items = value if isinstance(value, list) else [value]
    if not items:
        return BlockParse(False, errors=[ParseError(BAD_CALL, "empty list of calls", raw)])
    result = BlockParse(True)
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return BlockParse(
                False, errors=[ParseError(BAD_CALL, "a call must be an object with a name", raw)]
            )
        name = item["name"]
        args = item.get("parameters") or item.get("arguments", {})
        if isinstance(args, str):
            # Some models serialize the arguments twice; accept a string holding a JSON object.
            try:
                args = json.loads(args)
            except ValueError:
                pass
        if args is None:
            args = {}
        if not isinstance(args, dict):
            detail = f"arguments of {name!r} are {type(args).__name__}, not an object"
            return BlockParse(False, errors=[ParseError(BAD_ARGUMENTS, detail, raw)])
        if name not in schemas:
            result.errors.append(ParseError(UNKNOWN_TOOL, f"no tool named {name!r}", raw))
        result.calls.append((name, _dumps(args)))
    return result


_FUNCTION_START = "<function="
_FUNCTION_END = "</function>"
_PARAMETER = re.compile(r"<parameter=(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>)|$)", re.DOTALL)


def _parse_xml(block: str, schemas: dict[str, dict], raw: str) -> BlockParse:
    result = BlockParse(True)
    pos = block.find(_FUNCTION_START)
    if pos < 0:
        return BlockParse(False, errors=[ParseError(BAD_CALL, "no <function=NAME> in the block", raw)])
    while pos >= 0:
        body_start = pos + len(_FUNCTION_START)
        end = block.find(_FUNCTION_END, body_start)
        # Like SGLang, a function without </function> runs to the end of the block.
        body = block[body_start:] if end < 0 else block[body_start:end]
        gt = body.find(">")
        name = body[:gt].strip() if gt >= 0 else ""
        if not name:
            return BlockParse(False, errors=[ParseError(BAD_CALL, "malformed <function=NAME>", raw)])
        known = name in schemas
        if not known:
            result.errors.append(ParseError(UNKNOWN_TOOL, f"no tool named {name!r}", raw))
        props = schemas.get(name, {})
        args: dict[str, Any] = {}
        for match in _PARAMETER.finditer(body, gt + 1):
            inner = match.group(1)
            pgt = inner.find(">")
            if pgt < 0:
                return BlockParse(False, errors=[ParseError(BAD_CALL, "malformed <parameter=KEY>", raw)])
            key, value = inner[:pgt], inner[pgt + 1 :]
            # One leading and one trailing newline belong to the markup.
            if value.startswith("\n"):
                value = value[1:]
            if value.endswith("\n"):
                value = value[:-1]
            converted, problem = convert_value(value, props[key] if key in props else None)
            if known and key not in props:
                result.errors.append(ParseError(UNKNOWN_PARAMETER, f"{name}: no parameter {key!r}", raw))
            elif problem:
                result.errors.append(ParseError(BAD_VALUE, f"{name}.{key}: {problem}", raw))
            args[key] = converted
        result.calls.append((name, _dumps(args)))
        if end < 0:
            break
        pos = block.find(_FUNCTION_START, end + len(_FUNCTION_END))
    return result


def _schema_type(schema: dict | None) -> str:
    """The one type name to convert to: 'string' when undeclared, 'any' for a multi-type union."""
    if not isinstance(schema, dict) or "type" not in schema:
        return "string"
    declared = schema["type"]
    if isinstance(declared, list):
        types = [str(t).strip().lower() for t in declared if str(t).strip().lower() != "null"]
        return types[0] if len(types) == 1 else "any"
    return str(declared).strip().lower()


def convert_value(value: str, schema: dict | None) -> tuple[Any, str | None]:
    """Convert one qwen3_coder parameter value by its JSON schema (SGLang's rules).

    Returns the value and, when it does not fit the type, a problem description (the value is
    then the original string). ``null`` (any case) is None for every type; no schema means string.
    """
    if value.lower() == "null":
        return None, None
    if schema is None:
        return value, None
    kind = _schema_type(schema)
    if kind in ("string", "str", "text", "varchar", "char", "enum"):
        return value, None
    if kind.startswith(("int", "uint", "long", "short", "unsigned")):
        try:
            return int(value), None
        except ValueError:
            return value, f"{value!r} is not an integer"
    if kind.startswith(("num", "float")):
        try:
            number = float(value)
        except ValueError:
            return value, f"{value!r} is not a number"
        # "3" stays an int, "3.0" and "3e0" stay floats, as in SGLang.
        if number.is_integer() and "." not in value and "e" not in value.lower():
            return int(number), None
        return number, None
    if kind in ("boolean", "bool", "binary"):
        low = value.strip().lower()
        if low in ("true", "false"):
            return low == "true", None
        return value, f"{value!r} is not a boolean"
    structured = kind in ("object", "array", "arr") or kind.startswith(("dict", "list"))
    if structured:
        try:
            return json.loads(value), None
        except ValueError:
            pass
    try:
        # Python literals only (never eval); the result must still be JSON (no sets, bytes, complex).
        literal = ast.literal_eval(value)
        _dumps(literal)
        return literal, None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        # Other type names (custom or multi-type) fall back to the string quietly, as in SGLang.
        return value, (f"{value!r} is not a valid {kind}" if structured else None)
