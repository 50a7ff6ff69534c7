"""Verification: compare a candidate's outputs with the reference's, in the trusted process.

The candidate's process only writes its outputs; the comparison happens here, where no
candidate code has run, so monkeypatching torch inside the candidate cannot make it pass.
"""
from __future__ import annotations

import math

import torch

from env_pool.results import InputCheck
from tasks.task import Task


def check_outputs(index: int, task: Task, expected: list[torch.Tensor], got: list[torch.Tensor], meta: list[dict]) -> InputCheck:
    """One input set: structure first (count, shape, dtype, device, layout), then values."""
    if len(got) != len(expected):
        return InputCheck(index, False, reason=f"returned {len(got)} output(s), the reference returns {len(expected)}")
    worst_abs = 0.0
    for k, (e, g, m) in enumerate(zip(expected, got, meta)):
        where = f"output {k}" if len(expected) > 1 else "output"
        if tuple(g.shape) != tuple(e.shape):
            return InputCheck(index, False, reason=f"{where} has shape {list(g.shape)}, expected {list(e.shape)}")
        if g.dtype != e.dtype:
            return InputCheck(index, False, reason=f"{where} has dtype {g.dtype}, expected {e.dtype}")
        if m.get("device_type") != m.get("expected_device_type"):
            return InputCheck(index, False, reason=f"{where} is on {m.get('device_type')}, expected {m.get('expected_device_type')}")
        if not m.get("contiguous", True):
            return InputCheck(index, False, reason=f"{where} is not contiguous; return a contiguous tensor as the reference does")
        atol, rtol = task.tolerances(str(e.dtype).removeprefix("torch."))
        gc, ec = _comparable(g), _comparable(e)
        diff = (gc - ec).abs_()
        allowed = ec.abs().mul_(rtol).add_(atol)
        worst_abs = max(worst_abs, float(diff.max()) if diff.numel() else 0.0)
        # torch.allclose's rule, on the difference already at hand. First the common case: a
        # finite reference (its largest allowance finite: a NaN or an infinity makes it neither)
        # and every value within it; anything else is decided exactly below.
        if not diff.numel() or (math.isfinite(float(allowed.max())) and bool((diff <= allowed).all())):
            continue
        if g.is_floating_point() and bool(torch.isnan(g).any()):
            return InputCheck(index, False, reason=f"{where} contains NaN")
        # Where the reference is infinite only the same infinity is close, and a NaN in it never is.
        close = torch.where(ec.isfinite(), diff <= allowed, gc == ec)
        if not bool(close.all()):
            bad = close.numel() - int(close.sum())
            return InputCheck(index, False, worst_abs,
                              reason=f"{where}: {bad} of {e.numel()} values outside atol={atol:g}, rtol={rtol:g} (max abs error {worst_abs:.3g})")
    return InputCheck(index, True, worst_abs)


def _comparable(t: torch.Tensor) -> torch.Tensor:
    """``t`` in a dtype to subtract in: float32 and float64 as they are (as torch.allclose compares
    them; a float64 copy of both cost a cpp full evaluation a third of its checking), half
    precision in float32, integers and booleans in float64 (no overflow, no unsigned wrap)."""
    if t.dtype in (torch.float32, torch.float64):
        return t
    return t.float() if t.is_floating_point() else t.double()


def varies_with_inputs(outputs: list[list[torch.Tensor]]) -> bool:
    """Whether any output differs between input sets: a constant answer cannot be correct for every set."""
    first = outputs[0]
    return any(not all(torch.equal(a, b) for a, b in zip(first, other)) for other in outputs[1:])
