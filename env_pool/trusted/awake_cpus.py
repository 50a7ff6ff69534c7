"""The servers' CPUs kept awake between rounds: a spinner at the lowest priority on each.

TRUSTED SIDE (the harness, env_pool/trusted/harness.py, for the length of one request). A server
is frozen through the harness's staging and checking, milliseconds in which its CPU has nothing
to run: it falls into a deep sleep and wakes to the round cold, and the round pays for it on its
clock, in the server's wake and in every step of its forward's host path, more for a longer path
(a candidate's) than for a shorter one. On an H200 (2026-11-28, scripts/forward_stamps.py, side by
side in one lease), a round's steps took, without spinners and with them: the server's wake to its
forward 104-125 us and 22-83; a ``torch.empty_like`` the caching allocator serves 75-90 and 20-59;
the current stream 63-75 and 16-50; a ctypes launch 60-77 and 21-49. Back to back each costs a few
microseconds. (The speedups' distance from do_bench did not move beyond the noise between runs:
README.)

A SCHED_IDLE task runs only when nothing else on its CPU wants to: a server's thread that wakes
preempts it at once, and a spin touches a few cache lines. It is the harness's own child, outside
every sandbox and freezer; the code sampler attributes only the servers' processes' samples, and
its disturbance check counts only builds. It dies with the request (``awake``), or with the
harness's thread however that ends (PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence

# The spinner: pinned to its CPU (argv[1]) at the lowest priority, gone when the harness that
# started it (argv[2]) is; nice 19 where SCHED_IDLE is refused.
SPIN = """
import ctypes, os, signal, sys
ctypes.CDLL(None).prctl(1, signal.SIGKILL)
if os.getppid() != int(sys.argv[2]):
    sys.exit()
os.sched_setaffinity(0, {int(sys.argv[1])})
try:
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
except OSError:
    os.nice(19)
while True:
    pass
"""


@contextlib.contextmanager
def awake(cpus: Sequence[int]) -> Iterator[list[subprocess.Popen]]:
    """A spinner on each of ``cpus`` meanwhile (none for an empty sequence); each killed and reaped after."""
    spinners = [subprocess.Popen([sys.executable, "-I", "-S", "-c", SPIN, str(cpu), str(os.getpid())],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for cpu in cpus]
    try:
        yield spinners
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()
