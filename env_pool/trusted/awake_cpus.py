"""The servers' CPUs kept awake between rounds: a spinner at the lowest priority on each, asleep
through each round.

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
(a CPU-bound round lost 1.6-4.5 ms in 1 round of 17-37). So each spinner is asleep through each
round (``Awake.pause``, from before GO until the server is frozen again): it runs only while the
server cannot. It is the harness's own child, outside every sandbox and freezer; the code sampler
attributes only the servers' processes' samples, its disturbance check counts only builds, and
host_pressure does not count a SCHED_IDLE thread as holding a CPU. It dies with the request
(``awake``), or with the harness's thread however that ends (PR_SET_PDEATHSIG).

Off by default (env.keep_cpus_awake). Side by side on an H200 (2026-11-28, two leases, five
evaluations each of gelu_cuda and linear_relu_cublas_paper_cuda), the paused spinners took
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

PAUSE_WAIT_NS = 1_000_000  # how long pause() waits for the spinners to be asleep; one that has not said so by then is killed
START_WAIT_S = 2.0  # how long awake() waits for each spinner to run; one not running by then is killed


# The spinner: gone when the harness that started it (argv[1]) is. awake() pins it and sets its
# policy from outside, as it starts. Word 0 of the shared page (argv[3]) is the pause generation
# (odd: a round is about to run or runs, and at least 3); a spinner writes 1 into its own word
# (argv[2]) once it runs, and on seeing an odd generation writes that and sleeps on its own
# eventfd (argv[4]) until the harness writes to it.
SPIN = """
import ctypes, mmap, os, signal, sys
ctypes.CDLL(None).prctl(1, signal.SIGKILL)
if os.getppid() != int(sys.argv[1]):
    sys.exit()
mine, words, event = int(sys.argv[2]), memoryview(mmap.mmap(int(sys.argv[3]), mmap.PAGESIZE)).cast("q"), int(sys.argv[4])
words[mine] = 1
while True:
    generation = words[0]
    if generation & 1:
        words[mine] = generation
        os.eventfd_read(event)
"""


@dataclass
class Spinner:
    process: subprocess.Popen
    cpu: int
    word: int  # its word of the shared page
    event: int  # its eventfd: resume() writes 1 to wake it


class Awake:
    """One request's spinners, and their pause around each round (``Awake()`` has none: a no-op).

    ``pause`` before GO: each spinner goes to sleep on its eventfd, and pause waits until each has
    said so, so that none is runnable on a server's CPU while the server runs; one that has not
    said so within PAUSE_WAIT_NS is killed (it would run in the round, and every later round would
    wait for it). ``resume`` once the server is frozen again wakes them. ``dropped``: the CPUs of
    spinners killed for not answering, for the harness's log.
    """

    def __init__(self) -> None:
        self.spinners: list[Spinner] = []  # every one started, killed and reaped in close()
        self.pinned: list[Spinner] = []  # those pinned, set and answering
        self.dropped: list[int] = []
        self.fd = -1  # the shared page's memfd, made with the first spinner

    def start(self, cpu: int) -> None:
        """A spinner on ``cpu``; one whose CPU or policy cannot be set is killed at once: a spinner at a
        normal priority would take the server's CPU from it."""
        if self.fd < 0:
            self.fd = os.memfd_create("awake-cpus")
            os.ftruncate(self.fd, mmap.PAGESIZE)
            self.page = mmap.mmap(self.fd, mmap.PAGESIZE)
            self.words = memoryview(self.page).cast("q")
            self.words[0] = 2  # even: running
        event = os.eventfd(0, os.EFD_CLOEXEC)  # pass_fds hands it on; nothing else the harness starts inherits it
        try:
            process = subprocess.Popen([sys.executable, "-I", "-S", "-c", SPIN, str(os.getpid()), str(1 + len(self.spinners)),
                                        str(self.fd), str(event)], pass_fds=(self.fd, event),
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except BaseException:
            os.close(event)
            raise
        spinner = Spinner(process, cpu, 1 + len(self.spinners), event)
        self.spinners.append(spinner)  # before anything can raise: every one started is killed in close()
        try:
            os.sched_setscheduler(process.pid, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setaffinity(process.pid, {cpu})
        except OSError:
            process.kill()
        else:
            self.pinned.append(spinner)

    def wait_running(self, seconds: float = START_WAIT_S) -> None:
        """Each spinner running (its word set) within ``seconds``, or killed: one still starting
        when a round begins would not be paused in it."""
        deadline = time.monotonic() + seconds
        while any(self.words[s.word] == 0 for s in self.pinned) and time.monotonic() < deadline:
            time.sleep(0.001)
        self._drop([s for s in self.pinned if self.words[s.word] == 0])

    def pause(self) -> None:
        """Every spinner asleep (or killed): a round is about to begin."""
        if not self.pinned or self.words[0] & 1:
            return
        generation = self.words[0] + 1
        self.words[0] = generation
        waiting = self.pinned
        deadline = time.perf_counter_ns() + PAUSE_WAIT_NS
        while waiting and time.perf_counter_ns() < deadline:
            waiting = [s for s in waiting if self.words[s.word] != generation]
        self._drop(waiting)

    def resume(self) -> None:
        """The spinners woken: the round is over, its server frozen."""
        if not self.pinned or not self.words[0] & 1:
            return
        self.words[0] += 1
        for spinner in self.pinned:
            os.eventfd_write(spinner.event, 1)

    def _drop(self, spinners: list[Spinner]) -> None:
        for spinner in spinners:
            spinner.process.kill()
            self.pinned.remove(spinner)
            self.dropped.append(spinner.cpu)

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
    """A spinner on each of ``cpus`` meanwhile (none for an empty sequence), each running before this
    returns and asleep through each round; each killed and reaped after."""
    spinners = Awake()
    try:
        for cpu in cpus:
            spinners.start(cpu)
        if spinners.pinned:
            spinners.wait_running()
        yield spinners
    finally:
        spinners.close()
