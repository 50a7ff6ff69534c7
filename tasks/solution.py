"""The solution format: the file names a candidate solution to a task is made of.

A solution is ``model_new.py`` (class ModelNew, KernelBench's convention) beside the backend's
one kernel source and the headers it includes, or the paper's workspace layout (below). Two sides must agree on these names: the agent
writes the files (rollout/workspace.py checks each name as it is written) and the environment
evaluates them (env_pool/evaluate.py, env_pool/build/compile.py). rollout and env_pool are independent
layers that never import each other, so the format lives here, below both, beside the Task that
a solution solves; each side keeps its own rules on top (the workspace's name checks, the
compiler's flags).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

SOLUTION_FILE = "model_new.py"  # defines class ModelNew: the solution's entry point, always required


@dataclass(frozen=True)
class KernelFiles:
    source: str  # the one translation unit the backend compiles
    headers: tuple[str, ...]  # extensions that may sit beside it, for #include


# Keyed by tasks.task.BACKENDS.
KERNEL_FILES = {
    "cpp": KernelFiles("kernel.cpp", (".h", ".hpp")),
    "cuda": KernelFiles("kernel.cu", (".cuh", ".h", ".hpp")),
}

# The CUDA Agent paper's released workspace layout, read unchanged: kernels/*.cu (or .cpp) with a
# *_binding.cpp each that registers its functions through binding_registry.h, one extension
# module named cuda_extension built from every .cu and .cpp at the root and in kernels/, and a
# model_new.py that imports it. The two fixed files are the environment's (env_pool/build/paper_layout.py
# writes its own); a solution's copies of them are ignored.
KERNELS_DIR = "kernels"
EXTENSION_MODULE = "cuda_extension"
FIXED_FILES = ("binding.cpp", "binding_registry.h")
SOURCE_SUFFIXES = (".cu", ".cpp")
TEXT_SUFFIXES = (".py", ".cpp", ".cu", ".h", ".hpp", ".cuh")
_IMPORTS_EXTENSION = re.compile(rf"^\s*(import\s+{EXTENSION_MODULE}\b|from\s+{EXTENSION_MODULE}\s+import\b)", re.M)


def uses_extension_module(files: Mapping[str, str]) -> bool:
    """Whether a solution is in the paper's layout: its model_new.py imports cuda_extension."""
    return bool(_IMPORTS_EXTENSION.search(files.get(SOLUTION_FILE, "")))


def extension_sources(names: Iterable[str]) -> list[str]:
    """What the paper's compile script builds: every .cu and .cpp at the root and in kernels/, sorted."""
    return sorted(n for n in set(names) if n.endswith(SOURCE_SUFFIXES) and _placed(n))


def _placed(name: str) -> bool:
    """A file at the solution's root or directly in kernels/, with a plain name."""
    parts = name.split("/")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != KERNELS_DIR):
        return False
    return all(p and not p.startswith(".") for p in parts)


def solution_file_name_ok(name: str) -> bool:
    """A name the environment writes into its scratch folder: root or kernels/, a source or header or .py."""
    return _placed(name) and name.endswith(TEXT_SUFFIXES)


def read_solution(folder: Path) -> dict[str, str]:
    """A solution folder's files: those at its root and those in its kernels/ (the paper's layout).

    Build outputs (.so, .o, .pyc) and other folders are left out."""
    return {name: (folder / name).read_text(errors="replace") for name in solution_names(folder)}


def solution_names(folder: Path) -> list[str]:
    """The names of a solution folder's files, at its root and in kernels/ (build outputs left out)."""
    return [path.relative_to(folder).as_posix() for base in (folder, folder / KERNELS_DIR) if base.is_dir()
            for path in sorted(base.iterdir()) if path.is_file() and not path.name.endswith((".so", ".o", ".pyc"))]


def write_solution(folder: Path, files: Mapping[str, str]) -> None:
    """Write a solution's files (kernels/ included) into a folder."""
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
