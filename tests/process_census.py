"""Which processes a test's commands left running, found from /proc, not from what the environment says of them.

A process is the commands' when its environment carries the test's tag (the command and whatever
inherits its environment), or its command line or working folder lies under the test's folder
(sandboxed runs, whose environment is cleaned, name their scratch folder), or it descends from
one that is. The precompiled header's job (env_pool/build/inline_pch.py) and its compilers are counted
apart: the one process allowed to outlive a command.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    rss_mb: float
    args: str

    def __str__(self) -> str:
        return f"pid {self.pid} (parent {self.ppid}, {self.rss_mb:.0f} MB): {self.args[:160]}"


def census(folder: Path, tag: str) -> tuple[list[Proc], list[Proc]]:
    """(what the commands run with ``tag`` under ``folder`` left running, the header's job and its compilers)."""
    procs, marked = {}, set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        pid = int(name)
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{pid}/statm") as f:
                rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or a kernel thread
        procs[pid] = Proc(pid, ppid, rss, args)
        if tag.encode() in environ or str(folder) in args or cwd.startswith(str(folder)):
            marked.add(pid)
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)

    def tree(roots) -> set[int]:
        seen, todo = set(), list(roots)
        while todo:
            pid = todo.pop()
            if pid not in seen:
                seen.add(pid)
                todo += children.get(pid, [])
        return seen

    jobs = tree(p.pid for p in procs.values() if "env_pool.build.inline_pch" in p.args and "--job" in p.args)
    ours = tree(marked) - jobs
    return [procs[p] for p in sorted(ours)], [procs[p] for p in sorted(jobs)]


def header_jobs(procs: list[Proc]) -> list[Proc]:
    return [p for p in procs if "env_pool.build.inline_pch" in p.args]


def wait_for(predicate, timeout_s: float, poll_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(poll_s)
    return predicate()


def remaining(folder: Path, tag: str, timeout_s: float, job_too: bool = False) -> list[Proc]:
    """What is still running after up to ``timeout_s`` (the commands' processes; with ``job_too``, the job's too)."""
    def running() -> list[Proc]:
        left, job = census(folder, tag)
        return left + job if job_too else left

    wait_for(lambda: not running(), timeout_s, poll_s=1.0)
    return running()
