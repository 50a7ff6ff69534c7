"""Screen a task the way the paper filters synthesized tasks: does its reference work as a benchmark?

A usable task runs in eager mode (and under torch.compile when asked), is deterministic,
produces finite outputs that change when the inputs change and that no trivial kernel (zeros,
a constant, an input returned unchanged) matches within tolerance on the verification sets
(tasks/discriminate.py, the harness's own rule), and has an eager runtime inside a practical
window: too fast and timing noise dominates, too slow and episodes starve.

Synthesis asks more of a task it is about to make (``stable``, ``min_distinct``, several
``input_sets``): outputs finite on every set, not mostly a handful of repeated values, and a
reference that agrees with itself in float64 and under torch.compile on every set, so that a
correct kernel, which sums in its own order, cannot fail it.
"""
from __future__ import annotations

import copy
import itertools
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from tasks.discriminate import SPREAD_SHARE, plan
from tasks.task import Task, build_problem

# The filters, by the name a rejection is counted under (synthesis's report.json, the manifest's rows).
FILTERS = ("standalone", "eager", "finite", "trivial", "distinct", "deterministic", "input_dependent", "float64", "window", "compile")


@dataclass
class ScreenResult:
    task_id: str
    backend: str
    eager_ms: float | None = None  # median eager forward time
    compile_ok: bool | None = None  # None when torch.compile was not tried
    verification_sets: list[str] = field(default_factory=list)  # transformed sets the harness adds (tasks/discriminate.py)
    distinct: list[float] = field(default_factory=list)  # per output, the lowest share of distinct values over the sets
    problems: list[str] = field(default_factory=list)  # empty when the task is usable
    filters: list[str] = field(default_factory=list)  # the filter (FILTERS) behind each problem, in the same order

    @property
    def ok(self) -> bool:
        return not self.problems

    def fail(self, name: str, why: str) -> None:
        self.filters.append(name)
        self.problems.append(why)


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
    input_sets: int = 2,
    stable: bool = False,
    min_distinct: float = 0.0,
    min_spread: float = 0.0,
) -> ScreenResult:
    """Run the reference and report every way it falls short of a usable benchmark.

    ``transforms``: the harness's transformed sets may make the task discriminating (an existing
    task set, KernelBench's included); False: its own inputs must (a synthesized task).
    ``timed=False`` skips the runtime window (and torch.compile): the outputs' checks only.
    ``input_sets``: fresh sets of the task's own inputs every output check runs on (the verifier's
    env.correctness_inputs for synthesis). ``stable``: the reference must agree with itself in
    float64 on each set (and under torch.compile, when tried, on each set too). ``min_distinct``:
    the lowest share of distinct values an output may take on a set. ``min_spread``: the fewest
    tolerance widths the middle 98% of an output's values may span on a set.
    """
    result = ScreenResult(task.id, backend)
    device = "cuda" if backend == "cuda" else "cpu"
    try:
        problem = build_problem(task, backend)
        torch.manual_seed(0)
        with torch.device(device):  # weights made where they run (KernelBench's level 3 holds GiBs of them)
            model = problem.model_cls(*problem.get_init_inputs()).to(device).eval()
        make = _seeded_sets(problem, device)
        inputs_a = make(0)
        out_a = _outputs(model, inputs_a)
    except Exception as err:
        result.fail("eager", f"eager run failed: {type(err).__name__}: {err}")
        return result
    tolerances = lambda dtype: task.tolerances(str(dtype).removeprefix("torch."))  # noqa: E731
    unstable: list[str] = []
    wide = _float64(model) if stable else None
    made = itertools.count()  # the own sets are 0, 1, ...; the transforms' fresh sets follow

    def run(inputs: list) -> list[torch.Tensor]:
        """The reference on one set; with ``stable``, its float64 twin beside it on the same set."""
        outputs = _outputs(model, inputs)
        if wide is not None and not unstable:
            unstable.extend(_disagreement(wide, [_wide(v) for v in inputs], outputs, tolerances, "in float64"))
        return outputs

    sets = plan(run, lambda: make(next(made)), tolerances, own_sets=input_sets, transforms=transforms)
    result.verification_sets, result.distinct = sets.needed, sets.distinct
    if sets.nonfinite or not all(bool(torch.isfinite(o).all()) for o in out_a if o.is_floating_point()):
        result.fail("finite", "output has NaN or Inf" + (f": {'; '.join(sets.nonfinite)}" if sets.nonfinite else ""))
    if not sets.ok:
        where = "on any set the environment makes" if transforms else "on its own inputs"
        result.fail("trivial", f"a trivial kernel passes {where}: " + "; ".join(sets.trivial))
    few = [(k, share) for k, share in enumerate(sets.distinct) if share < min_distinct]
    if few:
        result.fail("distinct", "too few distinct values: " + "; ".join(
            f"{'output ' + str(k) if len(sets.distinct) > 1 else 'the output'} takes {share:.2%} distinct values "
            f"(at least {min_distinct:.0%} asked)" for k, share in few))
    narrow = [(k, widths) for k, widths in enumerate(sets.spread) if widths < min_spread]
    if narrow:
        result.fail("distinct", "nearly constant at the tolerance: " + "; ".join(
            f"{'output ' + str(k) if len(sets.spread) > 1 else 'the output'}'s middle {SPREAD_SHARE:.0%} of values spans {widths:.1f} "
            f"tolerance widths (at least {min_spread:g} asked)" for k, widths in narrow))
    # Within the task's tolerance, not bit for bit: the verifier compares a candidate with one run of
    # the reference at that tolerance, and cuDNN's 3-D transposed convolutions sum with atomics
    # (KernelBench level2/78 differed run to run on an H100, 2026-11-27, well inside it).
    again = _disagreement(model, inputs_a, out_a, tolerances, "run again on the same inputs")
    if again:
        result.fail("deterministic", "not deterministic: " + again[0])
    if all(torch.equal(x, y) for x, y in zip(out_a, _outputs(model, make(1)))):
        result.fail("input_dependent", "output does not depend on the inputs")
    if unstable:
        result.fail("float64", "unstable: " + unstable[0])
    if not timed:
        return result
    result.eager_ms = _time_ms(lambda: _outputs(model, inputs_a), repetitions, device)
    low, high = window_ms
    if not low <= result.eager_ms <= high:
        result.fail("window", f"eager time {result.eager_ms:.2f} ms is outside [{low}, {high}] ms")
    if try_compile and not result.problems:  # the slow check last, and only for a task that passed the rest
        # One set at a time: five sets held at once took a single-operator task's screen on an H100
        # out of its share of GPU memory (synth's workers, 2026-11-27).
        why = _compiles(model, (make(k) for k in range(input_sets)) if stable else [inputs_a], tolerances)
        result.compile_ok = not why
        if why:
            result.fail("compile", f"torch.compile fails or disagrees with eager: {why}")
    return result


def _seeded_sets(problem, device: str):
    """Input set k of the task's own, the same every time it is asked for (the compile check reruns the sets)."""
    def make(k: int) -> list:
        torch.manual_seed(1_000_003 * (k + 1))
        return [_to(v, device) for v in problem.get_inputs()]
    return make


def _float64(model: torch.nn.Module) -> torch.nn.Module:
    """The model's twin in float64: the same weights, widened."""
    return copy.deepcopy(model).double()


def _wide(value):
    return value.double() if isinstance(value, torch.Tensor) and value.dtype == torch.float32 else value


def _disagreement(model: torch.nn.Module, inputs: list, expected: list[torch.Tensor], tolerances, how: str) -> list[str]:
    """Where ``model`` on ``inputs`` leaves the reference's tolerance of ``expected``: a line, or none.

    A task whose float32 reference moves beyond its own tolerance when computed in float64 (a trunc
    before a LayerNorm: one flipped value moves a whole row) fails a correct kernel that sums in
    another order; the verifier cannot tell it from a wrong one."""
    try:
        got = _outputs(model, inputs)
    except Exception as err:
        return [f"the reference {how} failed: {type(err).__name__}: {err}"]
    for k, (g, e) in enumerate(zip(got, expected)):
        if not e.is_floating_point():
            if not torch.equal(g.to(e.dtype), e):
                return [f"output {k} {how} differs"]
            continue
        atol, rtol = tolerances(e.dtype)
        g = g.to(e.dtype)
        close = torch.isclose(g, e, atol=atol, rtol=rtol, equal_nan=True)
        if not bool(close.all()):
            off = int((~close).sum())
            return [f"{how}, {off:,} of {e.numel():,} values of output {k} differ from the float32 reference beyond "
                    f"its tolerance (atol {atol:g}, rtol {rtol:g})"]
    return []


def _compiles(model: torch.nn.Module, sets: Iterable[list], tolerances) -> str:
    """Why torch.compile's model fails or disagrees with eager on one of ``sets``; empty when it agrees on all.

    ``sets`` may be made as they are asked for: each is let go before the next is made."""
    try:
        compiled = torch.compile(model)
    except Exception as err:
        return f"{type(err).__name__}: {err}"[:300]
    k = 0  # not enumerate: its recycled result tuple holds the last set while the next is made
    for inputs in sets:
        why = _disagreement(compiled, inputs, _outputs(model, inputs), tolerances, "under torch.compile")
        del inputs
        if why:
            return f"on set {k}: {why[0]}"[:300]
        k += 1
    return ""


def _to(value, device: str):
    return value.to(device) if isinstance(value, torch.Tensor) else value
