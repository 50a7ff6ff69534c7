"""The solution format: the file names a candidate solution to a task is made of.

A solution is ``model_new.py`` (class ModelNew, KernelBench's convention) beside the backend's
one kernel source and the headers it includes. Two sides must agree on these names: the agent
writes the files (rollout/workspace.py checks each name as it is written) and the environment
evaluates them (env_pool/evaluate.py, env_pool/compile.py). rollout and env_pool are independent
layers that never import each other, so the format lives here, below both, beside the Task that
a solution solves; each side keeps its own rules on top (the workspace's name checks, the
compiler's flags).
"""
from __future__ import annotations

from dataclasses import dataclass

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
