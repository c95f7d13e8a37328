"""Generate reference/http-api.md and reference/openapi.json from the gateway app's OpenAPI document,
with the turn routes' request models added (`rlgw.gateway.app.openapi_document`)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import mkdocs_gen_files

from rlgw.gateway.app import GatewayConfig, create_app, openapi_document


def _document() -> dict[str, Any]:
    # Building the app opens the session journal in its data dir and nothing else: no engine is needed.
    with tempfile.TemporaryDirectory() as data_dir:
        app = create_app(GatewayConfig(engine_url="", data_dir=Path(data_dir)))
        return openapi_document(app.openapi())


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " or ".join(_type(s) for s in schema["anyOf"])
    if schema.get("type") == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if "enum" in schema:
        return " or ".join(json.dumps(v) for v in schema["enum"])
    if "const" in schema:
        return json.dumps(schema["const"])
    return schema.get("type", "any")


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def _body_model(op: dict[str, Any]) -> str | None:
    schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
    return schema["$ref"].rsplit("/", 1)[-1] if "$ref" in schema else None


def render(doc: dict[str, Any]) -> str:
    """The routes, then each request body's fields."""
    out = [
        "# HTTP API",
        "",
        "Generated at build time from the gateway's OpenAPI document (the running gateway serves it at"
        " `/openapi.json`; the turn routes' request models are added here). The whole document:"
        " [openapi.json](openapi.json). Turn routes come in two forms: `/s/{session_id}/v1/...` (the session"
        " in the path: the agent's base URL) and `/v1/...` (the session found by its key).",
        "",
        "| method | path | what it does | body |",
        "| --- | --- | --- | --- |",
    ]
    bodies: list[str] = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            model = _body_model(op)
            if model and model not in bodies:
                bodies.append(model)
            first = (op.get("description") or op.get("summary") or "").split("\n\n")[0]
            link = f"[{model}](#{model.lower()})" if model else ""
            out.append(f"| {method.upper()} | `{path}` | {_cell(first)} | {link} |")
    out.append("")
    schemas = doc["components"]["schemas"]
    for name in bodies:
        schema = schemas[name]
        required = set(schema.get("required", []))
        out += [f"## {name}", "", _cell(schema.get("description", "")), ""]
        out += ["| field | type | required | meaning |", "| --- | --- | --- | --- |"]
        for field, prop in schema.get("properties", {}).items():
            meaning, needed = _cell(prop.get("description", "")), "yes" if field in required else ""
            out.append(f"| `{field}` | {_cell(_type(prop))} | {needed} | {meaning} |")
        out.append("")
    return "\n".join(out)


_doc = _document()
with mkdocs_gen_files.open("reference/openapi.json", "w") as f:
    json.dump(_doc, f, indent=1)
with mkdocs_gen_files.open("reference/http-api.md", "w") as f:
    f.write(render(_doc))
