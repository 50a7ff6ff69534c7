"""Verification: compare a candidate's outputs with the reference's, in the trusted process.

The candidate's process only writes its outputs; the comparison happens here, where no
candidate code has run, so monkeypatching torch inside the candidate cannot make it pass.
"""
from __future__ import annotations

import math

import torch

from protocol.results import InputCheck
from tasks.task import Task


CHUNK = 1 << 26  # elements compared at once: a 6 GiB output's difference and allowance made whole took 13 GiB more of the device
HELD_ON_DEVICE = 1 << 30  # bytes of a device output Variation keeps where it is; a larger one it keeps in host memory


def check_outputs(index: int, task: Task, expected: list[torch.Tensor], got: list[torch.Tensor]) -> InputCheck:
    """One input set: structure first (count, shape, dtype), then values, as torch.allclose decides.

    Where an output lives and its layout are the server's to refuse (serve.py's _deliver): what
    is compared here is the harness's own copy of it.
    """
    if len(got) != len(expected):
        return InputCheck(index, False, reason=f"returned {len(got)} output(s), the reference returns {len(expected)}")
    worst_abs = 0.0
    for k, (e, g) in enumerate(zip(expected, got)):
        where = f"output {k}" if len(expected) > 1 else "output"
        if tuple(g.shape) != tuple(e.shape):
            return InputCheck(index, False, reason=f"{where} has shape {list(g.shape)}, expected {list(e.shape)}")
        if g.dtype != e.dtype:
            return InputCheck(index, False, reason=f"{where} has dtype {g.dtype}, expected {e.dtype}")
        atol, rtol = task.tolerances(str(e.dtype).removeprefix("torch."))
        bad = 0
        for e_part, g_part in _pieces(e, g):
            outside, part_worst = _outside(e_part, g_part, atol, rtol)
            worst_abs = max(worst_abs, part_worst)
            if outside < 0:
                return InputCheck(index, False, reason=f"{where} contains NaN")
            bad += outside
        if bad:
            return InputCheck(index, False, worst_abs,
                              reason=f"{where}: {bad} of {e.numel()} values outside atol={atol:g}, rtol={rtol:g} (max abs error {worst_abs:.3g})")
    return InputCheck(index, True, worst_abs)


def _pieces(e: torch.Tensor, g: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Matching pieces of CHUNK elements of two contiguous tensors (views, no copies); a strided one whole."""
    if e.is_contiguous() and g.is_contiguous() and e.numel() > CHUNK:
        return list(zip(e.view(-1).split(CHUNK), g.view(-1).split(CHUNK)))
    return [(e, g)]


def _outside(e: torch.Tensor, g: torch.Tensor, atol: float, rtol: float) -> tuple[int, float]:
    """(values of ``g`` not close to ``e``, or -1 where ``g`` holds a NaN that failed; the largest absolute difference)."""
    if not e.numel():
        return 0, 0.0
    gc, ec = _comparable(g), _comparable(e)
    diff = (gc - ec).abs_()
    allowed = ec.abs().mul_(rtol).add_(atol)
    worst = float(diff.max())
    # torch.allclose's rule, on the difference already at hand. First the common case: a finite
    # reference (its largest allowance finite: a NaN or an infinity makes it neither) and every
    # value within it; anything else is decided exactly below.
    if math.isfinite(float(allowed.max())) and bool((diff <= allowed).all()):
        return 0, worst
    if g.is_floating_point() and bool(torch.isnan(g).any()):
        return -1, worst
    # Where the reference is infinite only the same infinity is close, and a NaN in it never is.
    close = torch.where(ec.isfinite(), diff <= allowed, gc == ec)
    return close.numel() - int(close.sum()), worst


def _held(t: torch.Tensor, copy: bool) -> torch.Tensor:
    """``t`` as Variation keeps it: a large device tensor copied to the host, others as they are (or cloned)."""
    if t.device.type != "cpu" and t.numel() * t.element_size() > HELD_ON_DEVICE:
        return t.to("cpu")
    return t.clone() if copy else t


def _equal(held: torch.Tensor, t: torch.Tensor) -> bool:
    """torch.equal of a held tensor and a new one, wherever each lives; a host copy goes to the device in pieces."""
    if held.device == t.device:
        return torch.equal(held, t)
    if held.shape != t.shape or held.dtype != t.dtype:
        return False
    return all(torch.equal(h.to(t.device), part) for h, part in _pieces(held, t))


def _comparable(t: torch.Tensor) -> torch.Tensor:
    """``t`` in a dtype to subtract in: float32 and float64 as they are (as torch.allclose compares
    them; a float64 copy of both cost a cpp full evaluation a third of its checking), half
    precision in float32, integers and booleans in float64 (no overflow, no unsigned wrap)."""
    if t.dtype in (torch.float32, torch.float64):
        return t
    return t.float() if t.is_floating_point() else t.double()


class Variation:
    """Whether outputs differ between input sets: a constant answer cannot be correct for every set.

    Only the first set is held, and each later one compared with it as it comes (not every set
    kept: a KernelBench level-1 output is 6 GiB on the device, and five kept sets of the
    candidate's and the reference's ran the harness out of an H100's memory). A large first set
    waits in host memory: the candidate's and the reference's 8 GiB outputs of level 1's
    L1Norm_, held on the device beside the next round's, ran the H100 short again.
    """

    def __init__(self) -> None:
        self.first: list[torch.Tensor] | None = None
        self.varies = False

    def add(self, outputs: list[torch.Tensor], copy: bool = False) -> None:
        """One set's outputs; ``copy`` where the caller reuses their memory for the next set."""
        if self.first is None:
            self.first = [_held(o, copy) for o in outputs]
        elif not self.varies:
            self.varies = not all(_equal(a, b) for a, b in zip(self.first, outputs))
            if self.varies:
                self.first = []  # decided: the memory goes back
