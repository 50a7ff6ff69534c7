"""Render a config as YAML with each key's comment, taken from the schema's source.

The comments in ``configs/schema.py`` are the single place where keys are documented; this
turns them into ``configs/defaults.yaml`` and into ``cuda-agent config show``'s output.
"""
from __future__ import annotations

import ast
import dataclasses
import io
import tokenize
from enum import Enum
from functools import lru_cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from configs import schema


@lru_cache(maxsize=1)
def field_comments() -> dict[tuple[str, str], str]:
    """(dataclass name, field name) -> the trailing comment of that field's line."""
    source = Path(schema.__file__).read_text()
    comments = {
        tok.start[0]: tok.string.lstrip("# ").strip()
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    found: dict[tuple[str, str], str] = {}
    for cls in ast.parse(source).body:
        if isinstance(cls, ast.ClassDef):
            for node in cls.body:
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    found[(cls.name, node.target.id)] = comments.get(node.lineno, "")
    return found


def render(cfg: DictConfig, schema_cls: type = schema.Config) -> str:
    """YAML of ``cfg`` (a config of ``schema_cls``'s shape), a comment after every key."""
    out: list[str] = []
    _render_section(OmegaConf.to_container(cfg, resolve=False, enum_to_str=True), schema_cls, 0, out)
    return "\n".join(out) + "\n"


def _render_section(values: dict[str, Any], cls: type, indent: int, out: list[str]) -> None:
    comments = field_comments()
    pad = "  " * indent
    for f in dataclasses.fields(cls):
        comment = comments.get((cls.__name__, f.name), "")
        value = values[f.name]
        sub = _dataclass_type(f.type)
        if sub is not None:
            out.append(f"{pad}{f.name}:  # {comment}" if comment else f"{pad}{f.name}:")
            _render_section(value, sub, indent + 1, out)
        else:
            line = f"{pad}{f.name}: {_scalar(value)}"
            out.append(f"{line}  # {comment}" if comment else line)


def _dataclass_type(annotation: Any) -> type | None:
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    candidate = getattr(schema, name, None)
    return candidate if dataclasses.is_dataclass(candidate) else None


def _scalar(value: Any) -> str:
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, list) and value:  # flow style keeps a list on its commented line: [1, 5, 10]
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    if isinstance(value, dict) and value:  # and a mapping: {cuda-agent/role: learner}
        return "{" + ", ".join(f"{_scalar(k)}: {_scalar(v)}" for k, v in value.items()) + "}"
    text = OmegaConf.to_yaml({"v": value}).strip()
    return text[len("v: "):] if text.startswith("v: ") else text[len("v:"):].strip()
