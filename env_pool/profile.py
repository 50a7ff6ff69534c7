"""Timing: warm-up, whole-device synchronisation, cache flushing, rotated inputs, median and IQR.

Used by the trusted reference process (eager and torch.compile baselines) and by the
candidate's process (the candidate, and the eager reference again for drift correction).
``perf_counter`` is bound here at import, before any candidate code exists in the process,
so a candidate that replaces ``time.perf_counter`` does not change these clocks.
"""
from __future__ import annotations

import statistics
from time import perf_counter as _clock
from typing import Callable, Sequence

import torch

from env_pool.results import Timing

# Larger than any last-level cache we time on (H100: 50 MB L2; server CPUs: tens of MB of L3),
# so each repetition starts cold, as a kernel in a real network would.
FLUSH_BYTES = 256 * 2**20


class CacheFlusher:
    """Evicts caches between repetitions by writing a buffer larger than them."""

    def __init__(self, device: str):
        self.device = device
        self.buffer = torch.empty(FLUSH_BYTES // 4, dtype=torch.float32, device=device)

    def __call__(self) -> None:
        self.buffer.fill_(1.0)  # a write touches every line, on the GPU's L2 and the CPU's caches alike


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()  # the whole device: work on side streams is inside the timed region


def time_callable(
    fn: Callable[..., object],
    input_sets: Sequence[Sequence[object]],
    device: str,
    warmup: int = 5,
    repetitions: int = 30,
    flusher: CacheFlusher | None = None,
) -> Timing:
    """Median and IQR of ``fn(*inputs)`` over repetitions that rotate through ``input_sets``."""
    flusher = flusher or CacheFlusher(device)
    with torch.no_grad():
        for i in range(warmup):
            fn(*input_sets[i % len(input_sets)])
        synchronize(device)
        samples = [_time_once(fn, input_sets[i % len(input_sets)], device, flusher) for i in range(repetitions)]
    q1, _, q3 = statistics.quantiles(samples, n=4) if len(samples) > 1 else (samples[0],) * 3
    return Timing(median_ms=statistics.median(samples), iqr_ms=q3 - q1, repetitions=len(samples))


def _time_once(fn: Callable[..., object], inputs: Sequence[object], device: str, flusher: CacheFlusher) -> float:
    flusher()
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        synchronize(device)
        start.record()
        fn(*inputs)
        end.record()
        synchronize(device)
        return start.elapsed_time(end)
    begin = _clock()
    fn(*inputs)
    return (_clock() - begin) * 1e3
