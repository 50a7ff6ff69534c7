"""SKILL.md: what the agent reads at the start of every episode, one text per backend, its rules
section written from the rules in force (env.rules, tasks/rules.py): one text, never two kept by hand."""
from __future__ import annotations

import textwrap
from importlib import resources

from tasks.rules import rules_named

FILES = {"cuda": "SKILL.md", "cpp": "SKILL_cpp.md"}
WIDTH = 92  # the shipped texts' line width


def skill_text(backend: str, rules: str = "strict") -> str:
    """The skill spec for ``backend`` ("cuda" or "cpp") under ``rules`` ("strict" or "paper"), shipped with the package."""
    backend = str(backend)
    if backend not in FILES:
        raise ValueError(f"no SKILL.md for backend {backend!r}; env.backend must be one of {sorted(FILES)}")
    text = resources.files(__name__).joinpath(FILES[backend]).read_text()
    chosen = rules_named(rules)
    for key, line in (("libraries", chosen.skill_libraries), ("tolerance", chosen.skill_tolerance)):
        text = text.replace("{{rules." + key + "}}", _wrapped(line))
    return text


def _wrapped(line: str) -> str:
    """A rules line as a bullet's continuation: wrapped, indented two spaces after the first line."""
    return textwrap.fill(line, WIDTH - 2, subsequent_indent="  ", break_on_hyphens=False)
