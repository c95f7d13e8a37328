"""Generate reference/config.md from `TrainConfig`'s pydantic model: field types, defaults, meanings."""

from __future__ import annotations

import json
import types
import typing
from typing import Any

import mkdocs_gen_files
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from rlgw.trainer.config import TrainConfig


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models a field's type names (a union names several)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _models(arg)]
    return []


def _type(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation).replace("typing.", "")
    for module in ("rlgw.trainer.config.", "rlgw.trainer.settings.", "rlgw.trainer.consumer."):
        text = text.replace(module, "")
    return text.replace(" | ", " or ")


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value = info.default_factory()
        return "" if isinstance(value, BaseModel) else f"`{json.dumps(value)}`"
    if info.default is PydanticUndefined:
        return "required"
    value = info.default.value if hasattr(info.default, "value") else info.default
    return f"`{json.dumps(value)}`"


def _table(model: type[BaseModel], path: str, out: list[str]) -> list[tuple[str, type[BaseModel]]]:
    """One model's table; returns the nested models its fields name, with their dotted paths."""
    out += [f"## `{path}` ({model.__name__})" if path else "## Top level", ""]
    out += [" ".join((model.__doc__ or "").strip().split("\n\n")[0].split()), ""]
    out += ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
    nested = []
    for name, info in model.model_fields.items():
        out.append(f"| `{name}` | `{_type(info.annotation)}` | {_default(info)} | {info.description} |")
        nested += [(f"{path}.{name}" if path else name, sub) for sub in _models(info.annotation)]
    out.append("")
    return nested


def render() -> str:
    """The whole config reference page, one table per (nested) model, breadth first."""
    out = [
        "# Training config",
        "",
        "`rlgw train --config FILE` reads JSON or TOML into `rlgw.trainer.config.TrainConfig`; unknown keys"
        " are an error. Generated at build time from the model's fields (`trainer/config.py`).",
        "",
    ]
    queue: list[tuple[str, type[BaseModel]]] = [("", TrainConfig)]
    while queue:
        path, model = queue.pop(0)
        queue += _table(model, path, out)
    return "\n".join(out)


with mkdocs_gen_files.open("reference/config.md", "w") as f:
    f.write(render())
