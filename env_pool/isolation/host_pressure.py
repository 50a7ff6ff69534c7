"""Is the machine itself short of memory, or are its CPUs held by others? Read when a run fails.

A server that exceeds its time limit, or dies of memory far below its own limit, may have done
nothing wrong: orphaned compilers had filled a 2-core, 24 GiB machine (22 of 23 GiB in use, the
kernel swapping) when the baselines' server "exceeded its time limit" after 443 s and a server
was reported out of memory with "host limit 32768 MB, highest seen 337 MB" (issue #32). Such a
failure is the machine's, and its message must say so, with the numbers that show it: the
memory available, and the largest or busiest other processes.

Read after the failed run's processes are gone (run_sandboxed kills its tree before it returns),
so what it finds is everybody else's (the caller's own process is left out; its other children,
the environment's own work, are not: they take the same memory). Two readings, both from /proc:

- memory: short when less than MEMORY_SHORT_FRACTION of it is available, or when tasks stalled
  on memory (pressure stall information, "some avg10") for MEMORY_STALL_PCT of the last 10 s;
- CPUs: held when the threads of other processes used at least CPUS_HELD_FRACTION of the
  watched CPUs (the failed run's own) over a short sampling window. A thread counts on the CPU
  it last ran on, so other workers' servers, pinned elsewhere, do not count; nor does a thread at
  SCHED_IDLE, which runs only on a CPU nobody else wants (the harness's own spinners,
  env_pool/trusted/awake_cpus.py: the next request's, running as a hung candidate's verdict was
  read, made its timeout the machine's fault, retried and then dropped instead of failed).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

MEMORY_SHORT_FRACTION = 0.10  # of MemTotal available: below it the kernel reclaims and swaps in earnest
MEMORY_STALL_PCT = 20.0  # % of the last 10 s with some task stalled on memory (PSI)
CPUS_HELD_FRACTION = 0.5  # of the watched CPUs' time used by other processes' threads
WINDOW_S = 0.5  # the CPU sampling window
SHOWN = 3  # processes named in a message
TICK = os.sysconf("SC_CLK_TCK")
PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20


@dataclass(frozen=True)
class Process:
    pid: int
    name: str
    rss_mb: float
    cpu: float  # CPUs' worth used on the watched CPUs over the window

    def __str__(self) -> str:
        return f"{self.name} (pid {self.pid})"


@dataclass(frozen=True)
class HostState:
    """The machine's memory and the watched CPUs' use, less the caller's own process."""

    total_mb: float
    available_mb: float
    swap_used_mb: float
    memory_stall_pct: float  # PSI "some avg10" of memory; 0 where the kernel has no PSI
    watched_cpus: int
    others_cpu: float  # CPUs' worth used on the watched CPUs by other processes over the window
    largest: tuple[Process, ...]  # other processes by resident memory, largest first
    busiest: tuple[Process, ...]  # other processes by use of the watched CPUs, busiest first

    @property
    def short_of_memory(self) -> bool:
        return self.available_mb < MEMORY_SHORT_FRACTION * self.total_mb or self.memory_stall_pct >= MEMORY_STALL_PCT

    @property
    def cpus_held(self) -> bool:
        return self.watched_cpus > 0 and self.others_cpu >= CPUS_HELD_FRACTION * self.watched_cpus


def explain(state: HostState, memory: bool = True, cpu: bool = True) -> str:
    """Why the machine, not the run, is to blame (memory, the CPUs, or both, as asked); "" when neither."""
    parts = []
    if memory and state.short_of_memory:
        facts = [f"{state.available_mb:.0f} of {state.total_mb:.0f} MB available"]
        facts += [f"{state.swap_used_mb:.0f} MB of swap in use"] if state.swap_used_mb >= 1 else []
        facts += [f"tasks stalled on memory {state.memory_stall_pct:.0f}% of the last 10 s"] if state.memory_stall_pct >= 1 else []
        largest = ", ".join(f"{p} {p.rss_mb:.0f} MB" for p in state.largest[:SHOWN])
        parts.append(f"the machine is short of memory ({', '.join(facts)}); the largest other processes: {largest or 'none'}")
    if cpu and state.cpus_held:
        busiest = ", ".join(f"{p} {p.cpu:.1f} CPU" for p in state.busiest[:SHOWN])
        parts.append(f"other processes hold its CPUs ({state.others_cpu:.1f} of {state.watched_cpus} busy with their "
                     f"work): {busiest}")
    return "; and ".join(parts)


def note(watched: list[int] | None = None, memory: bool = True, cpu: bool = True) -> str:
    """``explain`` of the machine now, for a failure's message; "" when the machine is fine or cannot be read."""
    try:
        return explain(snapshot(watched), memory, cpu)
    except OSError:  # no /proc to read: say nothing rather than guess
        return ""


def snapshot(watched: list[int] | None = None, window_s: float = WINDOW_S) -> HostState:
    """The machine now; ``watched``: the CPUs whose use by others matters (default: this process's)."""
    cpus = set(watched) if watched else os.sched_getaffinity(0)
    meminfo = _meminfo()
    ours = {os.getpid()}  # the caller: a harness spins a thread of its own while it waits
    first = _thread_ticks(ours)
    time.sleep(window_s)
    second = _thread_ticks(ours)
    used: dict[int, float] = {}
    for (pid, tid), (ticks, cpu) in second.items():
        if cpu in cpus:
            used[pid] = used.get(pid, 0.0) + (ticks - first.get((pid, tid), (ticks, cpu))[0]) / TICK / window_s
    rss = {pid: _rss_mb(pid) for pid in _pids() if pid not in ours}
    by_size = sorted((pid for pid in rss if rss[pid] > 0), key=rss.get, reverse=True)[:SHOWN]
    by_cpu = sorted((pid for pid in used if used[pid] > 0.01), key=used.get, reverse=True)[:SHOWN]
    name = lambda pid: Process(pid, _name(pid), rss.get(pid, 0.0), used.get(pid, 0.0))  # noqa: E731
    return HostState(total_mb=meminfo.get("MemTotal", 0) / 1024, available_mb=meminfo.get("MemAvailable", 0) / 1024,
                     swap_used_mb=(meminfo.get("SwapTotal", 0) - meminfo.get("SwapFree", 0)) / 1024,
                     memory_stall_pct=_stall("memory"), watched_cpus=len(cpus), others_cpu=sum(used.values()),
                     largest=tuple(map(name, by_size)), busiest=tuple(map(name, by_cpu)))


def _meminfo() -> dict[str, int]:
    """/proc/meminfo in kB."""
    with open("/proc/meminfo") as f:
        return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f)}


def _stall(resource: str) -> float:
    try:
        with open(f"/proc/pressure/{resource}") as f:
            some = f.readline().split()
        return float(dict(kv.split("=") for kv in some[1:])["avg10"])
    except (OSError, KeyError, ValueError):
        return 0.0


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _thread_ticks(skip: set[int]) -> dict[tuple[int, int], tuple[int, int]]:
    """(pid, tid) -> (utime + stime in ticks, the CPU it last ran on), for every thread outside ``skip``
    that holds its CPU from others (not at SCHED_IDLE)."""
    out = {}
    for pid in _pids():
        if pid in skip:
            continue
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[38]) != os.SCHED_IDLE:  # fields from stat's third: utime 14, processor 39, policy 41
                    out[(pid, int(tid))] = (int(fields[11]) + int(fields[12]), int(fields[36]))
            except (OSError, IndexError, ValueError):
                continue
    return out


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE_MB
    except (OSError, IndexError, ValueError):
        return 0.0


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        words = [os.path.basename(a.decode(errors="replace")) for a in argv[:4] if a]
        return " ".join(words)[:60] or "?"
    except OSError:
        return "?"
