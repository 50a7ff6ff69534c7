"""The servers' CPUs kept awake between rounds: a spinner at the lowest priority on each, asleep
in each round once the server has taken its CPU.

TRUSTED SIDE (the harness, env_pool/trusted/harness.py, for the length of one request). A server
is frozen through the harness's staging and checking, milliseconds in which its CPU has nothing
to run: it falls asleep (on the H200's virtual machine, a halt the hypervisor sees) and wakes to
the round cold, and the round pays for it on its clock, in the server's wake and in every step of
its forward's host path, more for a longer path (a candidate's) than for a shorter one. On an H200
(2026-11-28, scripts/forward_stamps.py, side by side in one lease), a round's steps took, without
spinners and with them: the server's wake to its forward 104-125 us and 22-83; a
``torch.empty_like`` the caching allocator serves 75-90 and 20-59; the current stream 63-75 and
16-50; a ctypes launch 60-77 and 21-49. Back to back each costs a few microseconds. One F.gelu
launch's host time after 20 ms asleep (scripts/launch_after_idle.py, 2026-11-28 19:53, an H200):
0.155 ms, 0.024 with a spinner on its CPU, 0.022 back to back; /dev/cpu_dma_latency at 0 did not
help (0.131: the guest has no idle driver to hold back).

A SCHED_IDLE task runs only when nothing else on its CPU wants to, and a spin touches a few cache
lines. Yet a runnable one is handed the CPU whenever the server's threads yield (``sched_yield``:
spin barriers in C++ thread pools, Intel's OpenMP, CUDA's yield scheduling) and a whole slice
then (on the 2-core VM a 2 ms wait that yielded overshot by 2.8 ms), and now and then one anyway
(a CPU-bound round lost 1.6-4.5 ms in 1 round of 17-37). So in a round each spinner goes to sleep
as soon as it gets its CPU back from the server, until the server is frozen again (``Awake``). It
is the harness's own child, outside every sandbox and freezer; the code sampler attributes only the
servers' processes' samples, its disturbance check counts only builds, and host_pressure does not
count a SCHED_IDLE thread as holding a CPU. It dies with the request
(``awake``), or with the harness's thread however that ends (PR_SET_PDEATHSIG).

Off by default (env.keep_cpus_awake). Side by side on an H200 (2026-11-28, two leases, five
evaluations each of gelu_cuda and linear_relu_cublas_paper_cuda), spinners told to sleep before GO took
0.13-0.19 ms off eager GELU's GO to DONE (2.32-2.37 ms against 2.50-2.51) and 0.1-0.3 ms off the
candidate's, yet the speedups' distance from do_bench and their spread moved by no more than the
noise between runs (README: the timing's fidelity).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

START_WAIT_S = 2.0  # how long a spinner may take to reach its loop; one slower is killed

# The spinner: gone when the harness that started it (argv[1]) is. It starts on the harness's CPUs
# at their priority, says it is in its loop (its word, argv[3], of the shared page, argv[2]), and
# only then does awake() move it to its server CPU at SCHED_IDLE: starting at SCHED_IDLE beside a
# busy server took it seconds, through which it would spin without ever going to sleep. Word 0 is
# odd while a round runs (from just before GO); a spinner that finds it odd after it was preempted
# (the server took its CPU) sleeps on its own eventfd (argv[4]) until the harness writes to it. By
# preemptions, not by a gap in its clock: on the 2-core VM a spin saw 121 gaps of over 20 us a
# second (interrupts, the hypervisor) and would have slept before the server's wake.
SPIN = """
import ctypes, mmap, os, resource, signal, sys
ctypes.CDLL(None).prctl(1, signal.SIGKILL)
if os.getppid() != int(sys.argv[1]):
    sys.exit()
words, mine, event = memoryview(mmap.mmap(int(sys.argv[2]), mmap.PAGESIZE)).cast("q"), int(sys.argv[3]), int(sys.argv[4])
def preemptions():
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
words[mine] = 1
last = preemptions()
while True:
    now = preemptions()
    if words[0] & 1 and now != last:
        while words[0] & 1:  # a count left from a round it never slept in does not wake it
            os.eventfd_read(event)
        now = preemptions()
    last = now
"""


@dataclass
class Spinner:
    process: subprocess.Popen
    cpu: int
    word: int  # its word of the shared page: 1 once it is in its loop
    event: int  # its eventfd: round_over() writes 1 to wake it


class Awake:
    """One request's spinners, told when each round runs (``Awake()`` has none: a no-op).

    ``round_begun`` just before GO: a spinner spins on until the server's thread, woken, takes its
    CPU (the server never wakes to a halted CPU), and the next time the spinner gets the CPU in the
    round (the server's threads yield or block, or the scheduler gives an idle task its share) it
    goes to sleep at once, so it takes microseconds from the round, never a slice. ``round_over``
    once the server is frozen again wakes them. Told to sleep before GO instead, spinners left the
    CPU to halt in the microseconds before the server's wake, and on the H200 the wake to the
    forward took 40-140 us (three evaluations in each of two leases, 2026-11-28) where spinners
    that never slept had made it 16-59. This form has not yet run on a GPU.
    """

    def __init__(self) -> None:
        self.spinners: list[Spinner] = []  # every one started, killed and reaped in close()
        self.pinned: list[Spinner] = []  # those pinned and set
        self.fd = -1  # the shared page's memfd, made with the first spinner

    def start(self, cpu: int) -> None:
        """A spinner for ``cpu``, started where the calling thread may run (awake() moves it)."""
        if self.fd < 0:
            self.fd = os.memfd_create("awake-cpus")
            os.ftruncate(self.fd, mmap.PAGESIZE)
            self.page = mmap.mmap(self.fd, mmap.PAGESIZE)
            self.words = memoryview(self.page).cast("q")  # 0: odd while a round runs; 1...: each spinner in its loop
        event = os.eventfd(0, os.EFD_CLOEXEC)  # pass_fds hands it on; nothing else the harness starts inherits it
        try:
            word = 1 + len(self.spinners)
            process = subprocess.Popen([sys.executable, "-I", "-S", "-c", SPIN, str(os.getpid()), str(self.fd), str(word),
                                        str(event)], pass_fds=(self.fd, event),
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except BaseException:
            os.close(event)
            raise
        self.spinners.append(Spinner(process, cpu, word, event))  # before anything can raise: every one started is killed in close()

    def settle(self, seconds: float = START_WAIT_S) -> None:
        """Each spinner, once in its loop, moved to its CPU at SCHED_IDLE; one not in its loop within
        ``seconds``, or whose CPU or policy cannot be set, is killed (at its starting priority it
        would take the server's CPU from it)."""
        deadline = time.monotonic() + seconds
        for spinner in self.spinners:
            while self.words[spinner.word] != 1 and time.monotonic() < deadline:
                time.sleep(0.001)
            try:
                if self.words[spinner.word] != 1:
                    raise OSError("not in its loop in time")
                os.sched_setscheduler(spinner.process.pid, os.SCHED_IDLE, os.sched_param(0))
                os.sched_setaffinity(spinner.process.pid, {spinner.cpu})
            except OSError:
                spinner.process.kill()
            else:
                self.pinned.append(spinner)

    def round_begun(self) -> None:
        """A round is about to run: each spinner goes to sleep when it gets its CPU back from the server."""
        if self.pinned and not self.words[0] & 1:
            self.words[0] += 1

    def round_over(self) -> None:
        """The round is over, its server frozen: the spinners woken (one that never slept reads its count at the next round)."""
        if self.pinned and self.words[0] & 1:
            self.words[0] += 1
            for spinner in self.pinned:
                os.eventfd_write(spinner.event, 1)

    def close(self) -> None:
        for spinner in self.spinners:
            spinner.process.kill()
        for spinner in self.spinners:
            spinner.process.wait()
            os.close(spinner.event)
        self.spinners, self.pinned = [], []
        if self.fd >= 0:
            self.words.release()
            self.page.close()
            os.close(self.fd)
            self.fd = -1


@contextlib.contextmanager
def awake(cpus: Sequence[int]) -> Iterator[Awake]:
    """A spinner on each of ``cpus`` meanwhile (none for an empty sequence), asleep in each round
    (Awake); each killed and reaped after."""
    spinners = Awake()
    try:
        for cpu in cpus:
            spinners.start(cpu)
        spinners.settle()
        yield spinners
    finally:
        spinners.close()
