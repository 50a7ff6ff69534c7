"""Screen a task the way the paper filters synthesized tasks: does its reference work as a benchmark?

A usable task runs in eager mode (and under torch.compile when asked), is deterministic,
produces finite outputs that change when the inputs change and that no trivial kernel (zeros,
a constant, an input returned unchanged) matches within tolerance on the verification sets
(tasks/discriminate.py, the harness's own rule), and has an eager runtime inside a practical
window: too fast and timing noise dominates, too slow and episodes starve.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from tasks.discriminate import plan
from tasks.task import Task, build_problem


@dataclass
class ScreenResult:
    task_id: str
    backend: str
    eager_ms: float | None = None  # median eager forward time
    compile_ok: bool | None = None  # None when torch.compile was not tried
    verification_sets: list[str] = field(default_factory=list)  # transformed sets the harness adds (tasks/discriminate.py)
    problems: list[str] = field(default_factory=list)  # empty when the task is usable

    @property
    def ok(self) -> bool:
        return not self.problems


def _outputs(model: torch.nn.Module, inputs: list) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _time_ms(fn, repetitions: int, device: str) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repetitions):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def screen_task(
    task: Task,
    backend: str = "cpp",
    window_ms: tuple[float, float] = (1.0, 100.0),
    repetitions: int = 10,
    try_compile: bool = False,
    transforms: bool = True,
    timed: bool = True,
) -> ScreenResult:
    """Run the reference and report every way it falls short of a usable benchmark.

    ``transforms``: the harness's transformed sets may make the task discriminating (an existing
    task set, KernelBench's included); False: its own inputs must (a synthesized task).
    ``timed=False`` skips the runtime window (and torch.compile): the outputs' checks only."""
    result = ScreenResult(task.id, backend)
    device = "cuda" if backend == "cuda" else "cpu"
    try:
        problem = build_problem(task, backend)
        torch.manual_seed(0)
        with torch.device(device):  # weights made where they run (KernelBench's level 3 holds GiBs of them)
            model = problem.model_cls(*problem.get_init_inputs()).to(device).eval()
        inputs_a = [_to(v, device) for v in problem.get_inputs()]
        inputs_b = [_to(v, device) for v in problem.get_inputs()]
        out_a = _outputs(model, inputs_a)
    except Exception as err:
        result.problems.append(f"eager run failed: {type(err).__name__}: {err}")
        return result
    if not all(torch.isfinite(o).all() for o in out_a if o.is_floating_point()):
        result.problems.append("output has NaN or Inf")
    sets = plan(lambda inputs: _outputs(model, inputs), lambda: [_to(v, device) for v in problem.get_inputs()],
                lambda dtype: task.tolerances(str(dtype).removeprefix("torch.")), transforms=transforms)
    result.verification_sets = sets.needed
    if not sets.ok:
        where = "on any set the environment makes" if transforms else "on its own inputs"
        result.problems.append(f"a trivial kernel passes {where}: " + "; ".join(sets.trivial))
    if not all(torch.equal(x, y) for x, y in zip(out_a, _outputs(model, inputs_a))):
        result.problems.append("not deterministic: the same inputs gave different outputs")
    if all(torch.equal(x, y) for x, y in zip(out_a, _outputs(model, inputs_b))):
        result.problems.append("output does not depend on the inputs")
    if not timed:
        return result
    result.eager_ms = _time_ms(lambda: _outputs(model, inputs_a), repetitions, device)
    low, high = window_ms
    if not low <= result.eager_ms <= high:
        result.problems.append(f"eager time {result.eager_ms:.2f} ms is outside [{low}, {high}] ms")
    if try_compile and not result.problems:  # the slow check last, and only for a task that passed the rest
        result.compile_ok = _compiles(model, inputs_a, out_a, task)
        if not result.compile_ok:
            result.problems.append("torch.compile fails or disagrees with eager")
    return result


def _compiles(model: torch.nn.Module, inputs: list, expected: list[torch.Tensor], task: Task) -> bool:
    try:
        got = _outputs(torch.compile(model), inputs)
    except Exception:
        return False
    for g, e in zip(got, expected):
        atol, rtol = task.tolerances(str(e.dtype).removeprefix("torch."))
        if not torch.allclose(g, e, atol=atol, rtol=rtol):
            return False
    return True


def _to(value, device: str):
    return value.to(device) if isinstance(value, torch.Tensor) else value
