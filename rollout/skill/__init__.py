"""SKILL.md: what the agent reads at the start of every episode, one text per backend."""
from __future__ import annotations

from importlib import resources

FILES = {"cuda": "SKILL.md", "cpp": "SKILL_cpp.md"}


def skill_text(backend: str) -> str:
    """The skill spec for ``backend`` ("cuda" or "cpp"), shipped with the package."""
    backend = str(getattr(backend, "value", backend))
    if backend not in FILES:
        raise ValueError(f"no SKILL.md for backend {backend!r}; env.backend must be one of {sorted(FILES)}")
    return resources.files(__name__).joinpath(FILES[backend]).read_text()
