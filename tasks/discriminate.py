"""Input sets that tell a correct kernel from a trivial one: the paper's "no constant or
indistinguishable outputs" filter, applied to every task.

A verification set proves nothing if a kernel that does no work passes it. KernelBench's
``level1/19_ReLU`` draws its inputs with ``torch.rand`` (all positive), so ``relu(x) == x``
on every set the task makes, and ``forward(x): return x`` passed as correct. So for every
task the environment asks, over the verification sets it will use, whether each output of the
reference differs beyond the task's tolerance from

- each input of the same shape and dtype (a kernel that returns its input, or copies it),
- zeros, and
- any one constant (the best constant for the sets, not only their mean),

in at least one set. Where the task's own ``get_inputs`` does not (``tasks.discriminate.plan``),
sets made by transforms that keep every input's shape and dtype and still give a finite
reference are added, in ``TRANSFORMS``'s order, until it does: a zero-mean shift, a sign flip,
standard normal draws, and normal draws mixed with special values. A task that no transform
makes discriminating is reported (``cuda-agent tasks check``) and synthesis rejects it.

Used by the trusted harness (env_pool/trusted/harness.py, once per task), by ``cuda-agent tasks check``
and by the synthesis screen (tasks/screen.py): one implementation of the rule.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

CHUNK = 1 << 26  # elements reduced at once: a 6 GiB output's tolerance made whole would double the memory it needs
SPREAD_SHARE = 0.98  # the middle share of an output's values whose span is measured in tolerance widths
PROBES = 1 << 16  # positions of an output compared across sets (a fixed answer, computed once, passes if none moves)
SPECIAL_SHARE = 0.05  # of the elements each special value takes in the "special" transform


def _shift(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Zero mean: a sign change for half of an all-positive draw (torch.rand's [0, 1) becomes [-m, 1 - m))."""
    return x - x.float().mean().to(x.dtype)


def _sign_flip(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return -x


def _normal(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(x.shape, generator=gen, device=x.device, dtype=torch.float32).to(x.dtype)


def _special(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Normal draws with signed zeros, large and tiny magnitudes mixed in."""
    out = _normal(x, gen)
    pick = torch.rand(x.shape, generator=gen, device=x.device)
    for k, value in enumerate((0.0, -0.0, 100.0, -100.0, 1e-6, -1e-6)):
        out[(pick >= k * SPECIAL_SHARE) & (pick < (k + 1) * SPECIAL_SHARE)] = value
    return out


def _sparse_sign(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """SPARSE_FLIPS values with their sign changed at random positions: a kernel that samples m of
    n values to decide which set it is given (corpus rt3_relu_sign_probe) finds one with chance
    about m * SPARSE_FLIPS / n, so only a kernel that reads every value is right on this set. (A
    share of the values instead, one in a thousand, let its 64 probes find one 6% of the time.)"""
    flat = x.reshape(-1).clone()
    if flat.numel():
        at = torch.randint(flat.numel(), (SPARSE_FLIPS,), generator=gen, device=x.device)
        picked = flat[at]
        flat[at] = torch.where(picked >= 0, -picked - 1, 1 - picked)
    return flat.reshape(x.shape)


# Tried in this order, each only while the sets so far do not discriminate.
TRANSFORMS: dict[str, Callable[[torch.Tensor, torch.Generator], torch.Tensor]] = {
    "shift": _shift, "sign_flip": _sign_flip, "normal": _normal, "special": _special,
}
# Applied by transform_inputs too, but never chosen by plan(): the harness adds it beside the sets
# a task needs, so a set that looks like the task's own can still hold a few values of the other sign.
SPARSE_SIGN = "sparse_sign"
SPARSE_FLIPS = 8  # values a tensor (fewer where positions repeat); any one outside tolerance fails the set


def transform_inputs(name: str, inputs: list[Any], seed: int) -> list[Any]:
    """``inputs`` through the named transform: floating-point tensors changed, everything else as it is."""
    fn = _sparse_sign if name == SPARSE_SIGN else TRANSFORMS[name]
    out = []
    for value in inputs:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            gen = torch.Generator(value.device).manual_seed(seed)
            out.append(fn(value, gen))
            seed += 1
        else:
            out.append(value)
    return out


@dataclass
class _OutputState:
    """What the sets so far say of one output (a few scalars and flags, never the tensors)."""

    low: float = float("-inf")  # a constant within tolerance of every value of every set lies in [low, high]
    high: float = float("inf")
    zeros_fail: bool = False  # some set has a value zeros miss by more than the tolerance
    inputs_fail: dict[int, bool] = field(default_factory=dict)  # same-shaped input index -> some set tells it apart
    first: torch.Tensor | None = None  # the first set's values at PROBES positions
    moves: bool = False  # some later set differs there beyond the tolerance: no fixed answer passes
    nonfinite_sets: int = 0  # sets on which the output holds a NaN or an infinity
    distinct: float = 1.0  # the lowest share of distinct values among its PROBES positions, over the sets
    spread: float = float("inf")  # the fewest tolerance widths its probed values' middle SPREAD_SHARE spans, over the sets


@dataclass
class Discrimination:
    """The sets a task needs (``needed``: transform names beyond its own inputs) and what stays trivial."""

    needed: list[str] = field(default_factory=list)
    guards: list[str] = field(default_factory=list)  # sets checked besides (SPARSE_SIGN where a sign change was needed)
    trivial: list[str] = field(default_factory=list)  # what still passes every set: "output 0 = zeros", ...
    skipped: list[str] = field(default_factory=list)  # transforms whose reference was not finite, with why
    nonfinite: list[str] = field(default_factory=list)  # outputs with a NaN or Inf on some of the task's own sets
    distinct: list[float] = field(default_factory=list)  # per output, the lowest share of distinct probed values over the sets
    spread: list[float] = field(default_factory=list)  # per output, the fewest tolerance widths its values span over the sets

    @property
    def ok(self) -> bool:
        return not self.trivial

    def describe(self) -> str:
        sets = "its own inputs" + "".join(f" + {n}" for n in self.needed)
        return sets if self.ok else f"{sets}: still passed by {', '.join(self.trivial)}"


class Tracker:
    """Accumulates verification sets' reference outputs and says what a trivial kernel would still pass."""

    def __init__(self, tolerances: Callable[[torch.dtype], tuple[float, float]]):
        self.tolerances = tolerances
        self.outputs: list[_OutputState] | None = None
        self.sets = 0

    def add(self, inputs: list[Any], outputs: list[torch.Tensor]) -> None:
        if self.outputs is None:
            self.outputs = [_OutputState() for _ in outputs]
        self.sets += 1
        for state, out in zip(self.outputs, outputs):
            atol, rtol = self.tolerances(out.dtype)
            low, high, zeros_miss = _bounds(out, atol, rtol)
            state.low, state.high = max(state.low, low), min(state.high, high)
            state.zeros_fail |= zeros_miss
            probe = _probe(out)
            if out.is_floating_point() and not _finite(out):
                state.nonfinite_sets += 1
            # A few values taken again and again (a sign, a clamp's bounds) leave a kernel little to compute:
            # a chain ending in sign() took only +-1, 98.6% of them the sign of one bias (issue 36).
            state.distinct = min(state.distinct, torch.unique(probe).numel() / max(1, probe.numel()))
            state.spread = min(state.spread, _tolerance_widths(probe, atol, rtol))
            if state.first is None:
                state.first = probe
            elif not state.moves:
                state.moves = not _close(probe, state.first.to(probe.device), atol, rtol)
            for j, value in enumerate(inputs):
                if isinstance(value, torch.Tensor) and value.shape == out.shape and value.dtype == out.dtype:
                    state.inputs_fail[j] = state.inputs_fail.get(j, False) or not _close(value, out, atol, rtol)

    def nonfinite(self) -> list[str]:
        """Outputs that were not finite on some set, with on how many."""
        return [f"{self._where(k)} has NaN or Inf on {state.nonfinite_sets} of {self.sets} input sets"
                for k, state in enumerate(self.outputs or []) if state.nonfinite_sets]

    def distinct_shares(self) -> list[float]:
        """Per output, the lowest share of distinct values over the sets (1.0: every probed value differs)."""
        return [state.distinct for state in self.outputs or []]

    def spreads(self) -> list[float]:
        """Per output, the fewest tolerance widths its values' middle spans over the sets (inf: not a float output)."""
        return [state.spread for state in self.outputs or []]

    def _where(self, k: int) -> str:
        return f"output {k}" if len(self.outputs or []) > 1 else "the output"

    def trivial(self) -> list[str]:
        """The trivial kernels that pass every set so far, by name."""
        found = []
        for k, state in enumerate(self.outputs or []):
            where = self._where(k)
            if not state.zeros_fail:
                found.append(f"{where} = zeros (within tolerance of zero)")
            if state.low <= state.high:
                found.append(f"{where} = the constant {(state.low + state.high) / 2:.6g} (output is constant within tolerance)")
            found += [f"{where} = input {j} (returned unchanged)" for j, told in sorted(state.inputs_fail.items()) if not told]
            if not state.moves and state.zeros_fail and state.low > state.high:
                found.append(f"{where} = one fixed tensor (it does not change with the inputs beyond the tolerance)")
        return found


def plan(run: Callable[[list[Any]], list[torch.Tensor]], make: Callable[[], list[Any]],
         tolerances: Callable[[torch.dtype], tuple[float, float]], own_sets: int = 2, seed: int = 0,
         transforms: bool = True) -> Discrimination:
    """Which transformed sets a task needs so that its verification sets discriminate.

    ``run`` is the reference on one set (its outputs), ``make`` a fresh set of the task's own
    inputs. ``own_sets`` of the task's own sets first, then each transform in turn (on a fresh
    set) while a trivial kernel still passes; a transform whose reference is not finite is
    skipped (the harness never asks a kernel for an infinity the task itself does not make).
    ``transforms=False`` judges the task's own sets alone (synthesis: a task must discriminate as it is).
    """
    tracker = Tracker(tolerances)
    result = Discrimination()
    for _ in range(own_sets):
        inputs = make()
        tracker.add(inputs, run(inputs))
    for k, name in enumerate(TRANSFORMS if transforms else ()):
        if not tracker.trivial():
            break
        inputs = transform_inputs(name, make(), seed + 1000 * k)
        outputs = run(inputs)
        if not all(bool(torch.isfinite(o).all()) for o in outputs if o.is_floating_point()):
            result.skipped.append(f"{name}: the reference's output is not finite")
            continue
        tracker.add(inputs, outputs)
        result.needed.append(name)
    result.trivial = tracker.trivial()
    result.nonfinite, result.distinct, result.spread = tracker.nonfinite(), tracker.distinct_shares(), tracker.spreads()
    if {"shift", "sign_flip"} & set(result.needed) and all(
            bool(torch.isfinite(o).all()) for o in run(transform_inputs(SPARSE_SIGN, make(), seed + 7)) if o.is_floating_point()):
        result.guards.append(SPARSE_SIGN)
    return result


def _tolerance_widths(probe: torch.Tensor, atol: float, rtol: float) -> float:
    """How many tolerance widths (atol + rtol * |median|) the middle SPREAD_SHARE of the values spans.

    Few: the output is nearly one value at the verifier's tolerance, a constant misses it only at
    its edges (cos of a softmax over 64 values: 0.99927-0.99996, 2.4 widths, in a 200-task run).
    A sparse output (a ReLU's zeros) spans its nonzero values too, so sparsity is not flagged."""
    if not probe.is_floating_point() or not _finite(probe):
        return float("inf")
    values = probe.double()
    cut = (1 - SPREAD_SHARE) / 2
    low, mid, high = torch.quantile(values, torch.tensor([cut, 0.5, 1 - cut], dtype=values.dtype)).tolist()
    return (high - low) / (atol + rtol * abs(mid))


def _probe(out: torch.Tensor) -> torch.Tensor:
    """The output's values at PROBES evenly spread positions (all of them for a small output), kept on the host."""
    flat = out.reshape(-1)
    if flat.numel() > PROBES:
        # Integer positions: float32 linspace rounds the last one past the end for outputs above 2**24 elements.
        flat = flat[torch.arange(PROBES, device=flat.device) * (flat.numel() - 1) // (PROBES - 1)]
    return flat.detach().to("cpu", copy=True)


def _finite(out: torch.Tensor) -> bool:
    return all(bool(torch.isfinite(part).all()) for part in _pieces(out))


def _pieces(t: torch.Tensor) -> list[torch.Tensor]:
    flat = t.reshape(-1)
    return list(flat.split(CHUNK)) if flat.numel() > CHUNK else [flat]


def _bounds(out: torch.Tensor, atol: float, rtol: float) -> tuple[float, float, bool]:
    """(the lowest and highest constant within tolerance of every value, whether zeros miss some value)."""
    low, high, zeros_miss = float("-inf"), float("inf"), False
    for part in _pieces(out):
        e = part.double() if not part.dtype.is_floating_point or part.dtype == torch.float64 else part.float()
        allowed = e.abs().mul_(rtol).add_(atol)
        low = max(low, float((e - allowed).max()))
        high = min(high, float((e + allowed).min()))
        zeros_miss |= bool((e.abs() > allowed).any())
    return low, high, zeros_miss


def _close(got: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> bool:
    """torch.allclose's rule (NaNs unequal), in pieces."""
    for g, e in zip(_pieces(got), _pieces(expected)):
        if not torch.isclose(g, e, rtol=rtol, atol=atol).all():
            return False
    return True
