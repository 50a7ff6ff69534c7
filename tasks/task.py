"""The Task: one KernelBench-format problem, as plain data that crosses process and actor boundaries.

A problem file defines ``Model(nn.Module)``, ``get_inputs()`` and ``get_init_inputs()``
(KernelBench's convention; solutions define ``ModelNew``). Two optional module-level names
extend the format without breaking it for KernelBench's own tooling:

``PRESETS = {"cpp": {...}, "cuda": {...}}``
    Per-backend overrides of module-level names (sizes, usually). They are applied to the
    module's globals before ``get_inputs``/``get_init_inputs`` run, so a file's functions
    read them at call time. A backend without a preset runs the file's own constants.
``TOLERANCE = {"atol": ..., "rtol": ...}``
    Overrides the dtype default below for problems whose reference is ill-conditioned.
``LEVEL = n``
    The KernelBench level, when the folder name (``level1`` ...) does not say it.
"""
from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass, field
from typing import Any

# Correctness tolerances by output dtype. float32 allows accumulation-order differences
# in a K=4096 reduction (relative error ~1e-5) with a margin; the half types allow their
# 8/11-bit mantissas. Looser than bit-exact on purpose: a different but correct summation
# order must pass, while a zeroed or reduced-precision result must not.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-8, 1e-6),
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (2e-2, 2e-2),
}

BACKENDS = ("cpp", "cuda")


class TaskError(ValueError):
    """A problem file that cannot be used, with the reason."""


@dataclass(frozen=True)
class EntryPoints:
    """Names the problem file must define."""

    model: str = "Model"
    inputs: str = "get_inputs"
    init_inputs: str = "get_init_inputs"
    solution: str = "ModelNew"  # what a candidate solution defines


@dataclass(frozen=True)
class Task:
    """One problem. Holds source, never live objects, so it is msgpack-serialisable."""

    id: str  # unique within a task set, e.g. "level1/03_softmax"
    level: int  # KernelBench level 1-3; 0 when neither folder nor file says
    source: str  # the problem file's text; the reference is rebuilt from it anywhere
    path: str = ""  # where it was loaded from (informational; the source is authoritative)
    entry: EntryPoints = field(default_factory=EntryPoints)
    presets: dict[str, dict[str, Any]] = field(default_factory=dict)  # backend -> overrides
    atol: float | None = None  # None: DEFAULT_TOLERANCES by output dtype
    rtol: float | None = None

    def __post_init__(self) -> None:
        if not self.id:
            raise TaskError("Task.id is empty: give each task a unique id")
        if self.level not in (0, 1, 2, 3, 4):
            raise TaskError(f"Task {self.id}: level must be 0-4, got {self.level!r}")
        unknown = set(self.presets) - set(BACKENDS)
        if unknown:
            raise TaskError(
                f"Task {self.id}: PRESETS names unknown backend(s) {sorted(unknown)}; use {list(BACKENDS)}"
            )

    def tolerances(self, dtype: str) -> tuple[float, float]:
        """(atol, rtol) for an output of ``dtype`` (a torch dtype name such as 'float32')."""
        atol, rtol = DEFAULT_TOLERANCES.get(dtype, DEFAULT_TOLERANCES["float32"])
        return (self.atol if self.atol is not None else atol, self.rtol if self.rtol is not None else rtol)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Task":
        d = dict(d)
        d["entry"] = EntryPoints(**d.get("entry", {}))
        return cls(**d)


@dataclass
class Problem:
    """A task's module built for one backend: the live reference, in the process that runs it."""

    task: Task
    backend: str
    module: types.ModuleType

    @property
    def model_cls(self) -> type:
        return getattr(self.module, self.task.entry.model)

    def get_inputs(self) -> list[Any]:
        return list(getattr(self.module, self.task.entry.inputs)())

    def get_init_inputs(self) -> list[Any]:
        return list(getattr(self.module, self.task.entry.init_inputs)())


def build_problem(task: Task, backend: str) -> Problem:
    """Execute the task's source in a fresh module and apply the backend's preset."""
    if backend not in BACKENDS:
        raise TaskError(f"unknown backend {backend!r}; use one of {list(BACKENDS)}")
    module = types.ModuleType(f"cuda_agent_task_{abs(hash(task.id))}")
    module.__file__ = task.path or f"<task {task.id}>"
    exec(compile(task.source, module.__file__, "exec"), module.__dict__)
    module.__dict__.update(task.presets.get(backend, {}))
    return Problem(task=task, backend=backend, module=module)
