"""What a task's reference looks like for one backend: input shapes, dtypes, parameter count.

Inputs are built on PyTorch's meta device, so describing a GPU-sized preset on a small CPU
machine allocates nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tasks.task import Task, TaskError, build_problem


@dataclass(frozen=True)
class TaskShape:
    inputs: list[str]  # e.g. "float32[16, 1024]" or "int: 3"
    init_inputs: list[str]
    dtype: str  # dtype of the first floating-point input ("float32" when none)


def describe_value(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    return f"{type(value).__name__}: {value!r}"[:40]


def describe_task(task: Task, backend: str) -> TaskShape:
    """Build the problem's module, inputs and model on the meta device; raise TaskError on failure.

    A model whose constructor needs real data (it cannot run on the meta device) is not an error here.
    """
    try:
        problem = build_problem(task, backend)
    except Exception as err:  # the file is user code: any error is a load failure
        raise TaskError(f"executing the file failed: {type(err).__name__}: {err}") from err
    if not (isinstance(problem.model_cls, type) and issubclass(problem.model_cls, torch.nn.Module)):
        raise TaskError(f"{task.entry.model} must be a subclass of torch.nn.Module")
    try:
        with torch.device("meta"):
            init_inputs = problem.get_init_inputs()
            inputs = problem.get_inputs()
    except Exception as err:
        raise TaskError(f"[{backend}] building the inputs failed: {type(err).__name__}: {err}") from err
    try:
        with torch.device("meta"):
            problem.model_cls(*init_inputs)
    except Exception as err:
        # Loading must not depend on tracing on the meta device: a constructor that reads a value
        # (Swin's .item() on a drop-path schedule) cannot run there, yet builds fine on a device.
        # Such a model is built for real by the environment, which reports its own failures.
        if not _meta_only(err):
            raise TaskError(f"[{backend}] building the model failed: {type(err).__name__}: {err}") from err
    floats = [v for v in inputs if isinstance(v, torch.Tensor) and v.is_floating_point()]
    return TaskShape(
        inputs=[describe_value(v) for v in inputs],
        init_inputs=[describe_value(v) for v in init_inputs],
        dtype=str(floats[0].dtype).removeprefix("torch.") if floats else "float32",
    )


def _meta_only(err: Exception) -> bool:
    """Whether an error says only that the meta device cannot do this: torch has no exception type
    for it, only NotImplementedError (no Meta kernel) or a RuntimeError naming meta (.item())."""
    return isinstance(err, NotImplementedError) or "meta" in str(err).lower()
