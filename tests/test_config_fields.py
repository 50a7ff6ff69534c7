"""No dead config: every field of configs/schema.py is read where its comment says.

A leaf field's comment begins with the file(s) that read it, then what it does:
``infra_retries: int = 2  # env_pool/pool.py: times ...`` or ``# launch/eval.py, launch/heldout.py: ...``.
The check is static and conservative: each file named before the colon exists, is not a
test, and reads the field's name in code, as an attribute (``cfg.infra_retries``) or a key
(``cfg["infra_retries"]``, ``getattr(cfg, "infra_retries")``); comments and docstrings do not
count. Any other repository path the comment mentions must exist (a stale path misleads as
much as a missing one). Sections (``env.reward``, ``learner.rft``, the top-level sections)
are not leaves: their comments describe the section, and their leaves are checked by name,
since a reader is handed the section (``apply_reward(result, cfg.reward)`` reads ``cfg.correct``).
"""
from __future__ import annotations

import ast
import dataclasses
import re
import typing
from functools import lru_cache
from pathlib import Path

import pytest

from configs import schema
from configs.document import field_comments

ROOT = Path(__file__).resolve().parents[1]
READERS = re.compile(r"^(?P<files>[\w./-]+\.py(?:(?:, | and )[\w./-]+\.py)*): \S")
PATH = re.compile(r"[\w.-]+(?:/[\w.-]+)+\.py\b")  # a repository path: at least one folder


def leaf_fields(cls: type = schema.Config, prefix: str = "") -> list[tuple[str, type, str]]:
    """(dotted key, the dataclass that declares it, field name) for every leaf of the schema."""
    hints = typing.get_type_hints(cls)
    leaves = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            leaves += leaf_fields(hints[f.name], f"{prefix}{f.name}.")
        else:
            leaves.append((f"{prefix}{f.name}", cls, f.name))
    return leaves


@lru_cache(maxsize=None)
def names_read(path: Path) -> frozenset[str]:
    """Attribute names and string constants in a file's code (docstrings are whole sentences, never a bare name)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
    return frozenset(found)


def readers_of(comment: str) -> list[str]:
    match = READERS.match(comment)
    return re.split(r", | and ", match.group("files")) if match else []


FIELDS = leaf_fields()


def test_the_walk_finds_nested_sections_and_top_level_fields():
    keys = {key for key, _, _ in FIELDS}
    assert {"env.reward.compile_margin", "learner.rft.lr", "seed", "logging.out_dir"} <= keys
    assert "env.reward" not in keys and "learner" not in keys


@pytest.mark.parametrize("key,cls,name", FIELDS, ids=[key for key, _, _ in FIELDS])
def test_field_is_read_where_its_comment_says(key: str, cls: type, name: str):
    comment = field_comments()[(cls.__name__, name)]
    where = f"configs/schema.py, {cls.__name__}.{name}"
    readers = readers_of(comment)
    assert readers, (
        f"config field {key}: its comment ({comment!r}) does not begin with the file that reads it. "
        f"Fix: start the comment in {where} with that file, e.g. '# launch/train.py: ...'; if nothing reads "
        f"{key}, wire it in or remove it (schema, configs/*.yaml, docs) and regenerate configs/defaults.yaml")
    for reader in readers:
        path = ROOT / reader
        assert path.is_file() and not reader.startswith("tests/"), (
            f"config field {key}: its comment names {reader}, which is not a source file of this repository. "
            f"Fix: name the file that reads {key} in {where}")
        reads = name in names_read(path)  # a bool, so that a failure shows the message, not the file's every name
        assert reads, (
            f"config field {key}: its comment names {reader}, which never reads `.{name}` or `[{name!r}]`. "
            f"Fix: make {reader} read it, point the comment in {where} at the file that does, or remove the "
            f"field (schema, configs/*.yaml, docs) and regenerate configs/defaults.yaml")
    for mentioned in PATH.findall(comment):
        assert (ROOT / mentioned).is_file(), (
            f"config field {key}: its comment mentions {mentioned}, which does not exist. "
            f"Fix: correct the path in {where}")
