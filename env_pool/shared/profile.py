"""Timing helpers: cache flushing, whole-device synchronisation, and a plain timing loop.

The reward's timings are the trusted harness's (env_pool/trusted/harness.py): it flushes with
CacheFlusher and synchronises with synchronize() around every round. ``time_callable`` is the
plain loop that the agent's informational reference profile uses (env_pool/reference_profile.py).
"""
from __future__ import annotations

import ctypes
import statistics
from pathlib import Path
from time import perf_counter as _clock
from typing import Callable, Sequence

import torch

from protocol.results import Timing

# Larger than any last-level cache we time on (H100: 50 MB L2; server CPUs: tens of MB of L3),
# so each repetition starts cold, as a kernel in a real network would.
FLUSH_BYTES = 256 * 2**20
CPU_FLUSH_FACTOR = 2  # on the CPU: this many times the largest cache the machine reports (a 256 MB write a round cost 19 ms on 2 cores)


def flush_bytes(device: str) -> int:
    """How much CacheFlusher writes: FLUSH_BYTES on a GPU; twice the largest CPU cache (at most FLUSH_BYTES) on the CPU.

    On the 2-core CPU machine the 256 MB write was a third of a full-mode evaluation (150 rounds);
    twice its 32 MB L3 evicts it as surely. Where sysfs says nothing, FLUSH_BYTES.
    """
    if device == "cuda":
        return FLUSH_BYTES
    largest = 0
    for size in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = size.read_text().strip().upper()
            largest = max(largest, int(text.rstrip("KMG")) << {"K": 10, "M": 20, "G": 30}.get(text[-1:], 0))
        except (OSError, ValueError):
            continue
    return min(FLUSH_BYTES, CPU_FLUSH_FACTOR * largest) if largest else FLUSH_BYTES


class CacheFlusher:
    """Evicts caches between repetitions by writing a buffer larger than them.

    On a GPU, persisting L2 lines (a candidate's cudaLimitPersistingL2CacheSize and access-policy
    window) are first reset to normal: ordinary writes do not evict lines marked persisting.
    """

    def __init__(self, device: str):
        self.device = device
        self.buffer = torch.empty(flush_bytes(device) // 4, dtype=torch.float32, device=device)
        self.reset_persisting = _persisting_l2_reset() if device == "cuda" else None

    def __call__(self) -> None:
        if self.reset_persisting is not None:
            self.reset_persisting()
        self.buffer.fill_(1.0)  # a write touches every line, on the GPU's L2 and the CPU's caches alike


def _persisting_l2_reset():
    """cudaCtxResetPersistingL2Cache of the CUDA runtime torch loaded, or None where it cannot be found."""
    try:
        with open("/proc/self/maps") as maps:
            path = next(line.split()[-1] for line in maps if "libcudart.so" in line)
        return ctypes.CDLL(path).cudaCtxResetPersistingL2Cache
    except (OSError, StopIteration, AttributeError):
        return None


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()  # the whole device: work on side streams is finished before outputs are read


def time_callable(
    fn: Callable[..., object],
    input_sets: Sequence[Sequence[object]],
    device: str,
    warmup: int = 5,
    repetitions: int = 30,
    flusher: CacheFlusher | None = None,
) -> Timing:
    """Median and IQR of ``fn(*inputs)`` over repetitions that rotate through ``input_sets``.

    On the GPU each sample is the larger of the CUDA-event time on the current stream and the
    host clock between two whole-device synchronisations (less its fixed cost), so work on a
    side stream is not missed.
    """
    flusher = flusher or CacheFlusher(device)
    with torch.no_grad():
        for i in range(warmup):
            fn(*input_sets[i % len(input_sets)])
        synchronize(device)
        overhead = _sync_overhead_ms() if device == "cuda" else 0.0
        pairs = [_time_once(fn, input_sets[i % len(input_sets)], device, flusher) for i in range(repetitions)]
    samples = [max(event, wall - overhead) for event, wall in pairs]
    q1, _, q3 = statistics.quantiles(samples, n=4) if len(samples) > 1 else (samples[0],) * 3
    return Timing(median_ms=statistics.median(samples), iqr_ms=q3 - q1, repetitions=len(samples), samples_ms=samples)


def _time_once(fn: Callable[..., object], inputs: Sequence[object], device: str, flusher: CacheFlusher) -> tuple[float, float]:
    """(stream time, device-wide host time) of one call, in ms; the same number twice on CPU."""
    flusher()
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        synchronize(device)
        begin = _clock()
        start.record()
        fn(*inputs)
        end.record()
        synchronize(device)
        wall = (_clock() - begin) * 1e3
        return start.elapsed_time(end), wall
    begin = _clock()
    fn(*inputs)
    elapsed = (_clock() - begin) * 1e3
    return elapsed, elapsed


def _sync_overhead_ms(rounds: int = 20) -> float:
    """Host time of record, record, synchronise around nothing: what an empty call costs on the host clock."""
    return statistics.median(max(0.0, w - e) for e, w in (_time_once(lambda: None, (), "cuda", lambda: None) for _ in range(rounds)))
