"""The parent's watch over one sandboxed run's process tree: who is in it, what it holds, its end.

Trusted side (the worker's process, beside ``run_sandboxed`` in env_pool/isolation/sandbox.py). What it
reads of the run is what the kernel says about it, never what the run says: membership from
/proc (the shim's descendants, through psutil) and from the run's cgroups, resident memory
from each member's /proc entry, exit from a pidfd. Killing uses every handle at once (the
cgroups, the process group, each process seen), so a process that left the group or the tree
still dies, and a pid the kernel reused for someone else is never signalled (psutil checks the
creation time; the group id stays ours while the shim is unreaped).

psutil is imported where it is used: importing env_pool.isolation.sandbox stays light.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Callable

from env_pool.isolation.cgroups import RunCgroups

if TYPE_CHECKING:
    import psutil


class TreeWatch:
    """The process tree under the shim ``pid`` (also its process group id) and its cgroups."""

    def __init__(self, pid: int, cgroups: RunCgroups) -> None:
        self.pid = pid
        self.cgroups = cgroups
        self.tracked: dict[int, psutil.Process] = {}
        self.shim_reaped = threading.Event()  # set once the shim is reaped: its pid may be reused
        self.out_of_memory = threading.Event()  # the memory watch killed the tree
        self.peak_mb = 0.0  # highest RSS sum the memory watch saw
        self._kill_lock = threading.Lock()
        self._stop = threading.Event()
        self._dog: threading.Thread | None = None

    def kill_tree(self) -> None:
        """Everything we know of, by every handle we have. Safe to call repeatedly."""
        import psutil

        with self._kill_lock:
            self.cgroups.kill()
            if not self.shim_reaped.is_set():
                # While the shim is unreaped its pid, and so the group id, cannot be reused.
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            for p in list(self.tracked.values()):
                try:
                    p.kill()  # psutil checks the creation time: a reused pid is not signalled
                except psutil.Error:
                    pass

    def members(self) -> set[int]:
        """The process tree (complete under a PID namespace: orphans stay below its init),
        plus the cgroups' members (complete without one, whatever a process reparented to)."""
        import psutil

        try:
            pids = {c.pid for c in psutil.Process(self.pid).children(recursive=True)}
        except psutil.Error:
            pids = set()
        pids.update(self.cgroups.pids() or ())
        return pids

    def move_cpus(self, cpus: tuple[int, ...]) -> bool:
        """Move the whole run to ``cpus``; True when every thread of it is there."""
        self.cgroups.set_cpus(cpus)  # first: a thread's affinity cannot leave its cpuset
        return move_threads(self.members() | {self.pid}, set(cpus))

    def watch_memory(self, limit_bytes: int, poll_s: float, init_pid: Callable[[], int | None],
                     watching: Callable[[], bool]) -> None:
        """Start polling the tree's resident memory every ``poll_s``: over ``limit_bytes``, kill it.

        The shim and the PID namespace's init (``init_pid()``) are ours and not counted. While
        ``watching()`` is False (a warm start still runs only trusted start-up) nothing is polled.
        """
        self._dog = threading.Thread(target=self._memory_loop, args=(limit_bytes, poll_s, init_pid, watching),
                                     daemon=True)
        self._dog.start()

    def stop_memory_watch(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> None:
        if self._dog is not None:
            self._dog.join(timeout)

    def _memory_loop(self, limit_bytes: int, poll_s: float, init_pid: Callable[[], int | None],
                     watching: Callable[[], bool]) -> None:
        import psutil

        while not self._stop.is_set():
            if not watching():  # trusted start-up: nothing to watch yet
                self._stop.wait(poll_s)
                continue
            ours = {self.pid, init_pid()}
            rss = 0
            for p_id in self.members():
                p = self.tracked.get(p_id)
                if p is None:
                    try:
                        p = self.tracked[p_id] = psutil.Process(p_id)
                    except psutil.Error:
                        continue
                if p_id in ours:
                    continue
                try:
                    rss += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak_mb = max(self.peak_mb, rss / 2**20)
            if rss > limit_bytes:
                self.out_of_memory.set()
                self.kill_tree()
                return
            self._stop.wait(poll_s)


def move_threads(pids: set[int], cpus: set[int]) -> bool:
    """Set the affinity of every thread of ``pids`` to ``cpus``; True when each one reads back exactly that.

    Twice over: a thread started during the first pass by a thread not yet moved inherits the old set.
    """
    for _ in range(3):
        threads = [int(t) for p in pids for t in _list_dir(f"/proc/{p}/task")]
        for tid in threads:
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:
                pass
        try:
            if threads and all(os.sched_getaffinity(t) == cpus for t in threads):
                return True
        except OSError:
            pass
    return False


def _list_dir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


class ExitWaiter:
    """Wait for a child's exit with a timeout, without reaping it (pidfd; polling as fallback)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self.pidfd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.pidfd = None

    def wait(self, timeout: float) -> bool:
        import select

        deadline = time.monotonic() + max(0.0, timeout)
        if self.pidfd is not None:
            while True:
                try:
                    ready, _, _ = select.select([self.pidfd], [], [], max(0.0, deadline - time.monotonic()))
                    return bool(ready)
                except InterruptedError:
                    continue
        while True:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is not None:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
