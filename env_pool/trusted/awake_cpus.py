"""The servers' CPUs kept awake between rounds: a spinner at the lowest priority on each.

TRUSTED SIDE (the harness, env_pool/trusted/harness.py, for the length of one request). A server
is frozen through the harness's staging and checking, milliseconds in which its CPU has nothing
to run: it falls into a deep sleep and wakes to the round cold, and the round pays for it on its
clock, in the server's wake and in every step of its forward's host path, more for a longer path
(a candidate's) than for a shorter one. On an H200 (2026-11-28, scripts/forward_stamps.py, side by
side in one lease), a round's steps took, without spinners and with them: the server's wake to its
forward 104-125 us and 22-83; a ``torch.empty_like`` the caching allocator serves 75-90 and 20-59;
the current stream 63-75 and 16-50; a ctypes launch 60-77 and 21-49. Back to back each costs a few
microseconds.

A SCHED_IDLE task runs only when nothing else on its CPU wants to: a server's thread that wakes
preempts it at once, and a spin touches a few cache lines. It is the harness's own child, outside
every sandbox and freezer; the code sampler attributes only the servers' processes' samples, its
disturbance check counts only builds, and host_pressure does not count a SCHED_IDLE thread as
holding a CPU. It dies with the request (``awake``), or with the harness's thread however that
ends (PR_SET_PDEATHSIG).

Off by default (env.keep_cpus_awake), after a red-team review: a thread that yields
(``sched_yield``: spin barriers in C++ thread pools, Intel's OpenMP, CUDA's yield scheduling)
hands the spinner a whole slice (on the 2-core VM a 2 ms wait that yields overshot by 2.8 ms), a
CPU-bound round loses a slice of 1.6-4.5 ms now and then (1 round of 17-37), and on the H200 the
speedups' distance from do_bench did not move beyond the noise between runs (README).
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence

# The spinner: gone when the harness that started it (argv[1]) is. awake() pins it and sets its
# policy from outside, as it starts.
SPIN = """
import ctypes, os, signal, sys
ctypes.CDLL(None).prctl(1, signal.SIGKILL)
if os.getppid() != int(sys.argv[1]):
    sys.exit()
while True:
    pass
"""


@contextlib.contextmanager
def awake(cpus: Sequence[int]) -> Iterator[list[subprocess.Popen]]:
    """A spinner on each of ``cpus`` meanwhile (none for an empty sequence); each killed and reaped after.

    One whose CPU or policy cannot be set is killed at once: a spinner at a normal priority would
    take the server's CPU from it.
    """
    spinners: list[subprocess.Popen] = []
    try:
        for cpu in cpus:
            spinner = subprocess.Popen([sys.executable, "-I", "-S", "-c", SPIN, str(os.getpid())],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            spinners.append(spinner)  # before anything can raise: every one started is killed below
            try:
                os.sched_setscheduler(spinner.pid, os.SCHED_IDLE, os.sched_param(0))
                os.sched_setaffinity(spinner.pid, {cpu})
            except OSError:
                spinner.kill()
        yield spinners
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()
