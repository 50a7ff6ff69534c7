"""Fresh cgroups for one sandboxed run: caps, CPU placement, membership and a kill switch.

Trusted side (the worker's process): ``run_sandboxed`` (env_pool/isolation/sandbox.py) creates them
before the shim starts, the shim (env_pool/isolation/sandbox_shim.py) joins them by writing its pid
into each ``cgroup.procs`` listed in ``join_list()``, and every process of the run inherits
them. Everything is soft: a controller the machine lacks is simply not listed, and the labels
say what was made (the run's ``required_isolation`` decides whether that is enough).
"""
from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path


class RunCgroups:
    """Fresh cgroups for one run, where the machine lets us create them (all soft).

    pids: a hard cap on processes + threads (the only fork-bomb limit that binds root).
    memory: a hard backstop above memory_mb (the kernel's OOM killer acts between two watchdog
    polls, and tmpfs pages, which are not RSS, are charged too).
    cpuset: SandboxLimits.cpus, enforced by the kernel whatever the run does to its affinity.
    cgroup v2 without controllers still gives ``cgroup.kill``: kill every member at once,
    whatever sessions or process groups they moved to, and ``cgroup.freeze`` (or v1's freezer):
    stop every member at once and know when they are all stopped (``Freezer``), which the
    harness uses to keep a server still outside its timed window. Membership also drives the
    watchdog.
    """

    _counter = 0

    def __init__(self) -> None:
        self.dirs: list[tuple[Path, str]] = []  # (cgroup dir, isolation label)

    @classmethod
    def create(cls, memory_mb: int, max_pids: int, cpus: tuple[int, ...], skip: tuple[str, ...]) -> "RunCgroups":
        """Cgroups for a run under SandboxLimits' ``memory_mb``, ``max_pids``, ``cpus``, ``skip_isolation``."""
        self = cls()
        cls._counter += 1
        name = f"cuda-agent-sandbox-{os.getpid()}-{cls._counter}-{time.monotonic_ns() % 10**9}"
        try:
            v1, v2 = _cgroup_mounts()
            own = _own_cgroups()
        except OSError:
            return self
        mem_bytes = (memory_mb + 1024) << 20
        skipped = set(skip)
        cpu_list = ",".join(str(c) for c in sorted(set(cpus)))
        for ctrl in ("pids", "memory", "cpuset", "freezer"):
            if ctrl == "cpuset" and not cpu_list:
                continue
            if ctrl == "freezer" and (v2 is not None and "" in own):
                continue  # cgroup v2's cgroup.freeze, below, where there is one
            if ctrl in v1 and ctrl in own and f"cgroup-{ctrl}" not in skipped:
                d = v1[ctrl] / own[ctrl].lstrip("/") / name
                try:
                    d.mkdir()
                except OSError:
                    continue
                try:
                    if ctrl == "pids":
                        (d / "pids.max").write_text(str(max_pids))
                    elif ctrl == "freezer":
                        (d / "freezer.state").read_text()  # present: a v1 freezer
                    elif ctrl == "cpuset":
                        # A v1 cpuset starts empty: it needs its memory nodes before any member.
                        (d / "cpuset.mems").write_text((d.parent / "cpuset.mems").read_text())
                        (d / "cpuset.cpus").write_text(cpu_list)
                    else:
                        (d / "memory.limit_in_bytes").write_text(str(mem_bytes))
                        if (d / "memory.memsw.limit_in_bytes").exists():
                            (d / "memory.memsw.limit_in_bytes").write_text(str(mem_bytes))
                    self.dirs.append((d, "cgroup-freeze" if ctrl == "freezer" else f"cgroup-{ctrl}"))
                except OSError:
                    _rmdir(d)
        if v2 is not None and "" in own:
            d = v2 / own[""].lstrip("/") / name
            try:
                d.mkdir()
            except OSError:
                return self
            labels = []
            try:
                controllers = (d / "cgroup.controllers").read_text().split()
                if "pids" in controllers and not self.has("cgroup-pids") and "cgroup-pids" not in skipped:
                    (d / "pids.max").write_text(str(max_pids))
                    labels.append("cgroup-pids")
                if "memory" in controllers and not self.has("cgroup-memory") and "cgroup-memory" not in skipped:
                    (d / "memory.max").write_text(str(mem_bytes))
                    if (d / "memory.swap.max").exists():
                        (d / "memory.swap.max").write_text("0")
                    labels.append("cgroup-memory")
                if cpu_list and "cpuset" in controllers and not self.has("cgroup-cpuset") and "cgroup-cpuset" not in skipped:
                    (d / "cpuset.cpus").write_text(cpu_list)
                    labels.append("cgroup-cpuset")
            except OSError:
                pass
            if (d / "cgroup.kill").exists() and "cgroup-kill" not in skipped:
                labels.append("cgroup-kill")
            if (d / "cgroup.freeze").exists() and "cgroup-freeze" not in skipped:
                labels.append("cgroup-freeze")
            if labels:
                self.dirs.append((d, ",".join(labels)))
            else:
                _rmdir(d)
        return self

    def has(self, label: str) -> bool:
        return any(label in lab.split(",") for _, lab in self.dirs)

    def set_cpus(self, cpus: tuple[int, ...]) -> bool:
        """Move the cpuset to ``cpus`` (the kernel moves every member with it); False without one."""
        text = ",".join(str(c) for c in sorted(set(cpus)))
        done = False
        for d, lab in self.dirs:
            if "cgroup-cpuset" in lab.split(","):
                try:
                    (d / "cpuset.cpus").write_text(text)
                    done = True
                except OSError:
                    pass
        return done

    def freezer(self) -> "Freezer | None":
        """The run's freezer (cgroup v2's cgroup.freeze, else v1's freezer), or None where it has none."""
        for d, lab in self.dirs:
            if "cgroup-freeze" in lab.split(","):
                return Freezer(d)
        return None

    def join_list(self) -> list[list[str]]:
        return [[str(d / "cgroup.procs"), lab] for d, lab in self.dirs]

    def pids(self) -> list[int] | None:
        """Members of the run (outer pids), or None without a cgroup."""
        if not self.dirs:
            return None
        out: set[int] = set()
        for d, _ in self.dirs:
            try:
                out.update(int(x) for x in (d / "cgroup.procs").read_text().split())
            except OSError:
                pass
        return sorted(out)

    def kill(self) -> None:
        for d, lab in self.dirs:
            if "cgroup-freeze" in lab.split(","):  # v1's frozen tasks die only once thawed
                Freezer(d).thaw()
        for d, lab in self.dirs:
            if "cgroup-kill" in lab:
                try:
                    (d / "cgroup.kill").write_text("1")
                    continue
                except OSError:
                    pass
            try:
                members = [int(x) for x in (d / "cgroup.procs").read_text().split()]
            except OSError:
                continue
            for p in members:  # members of our own fresh cgroup: never someone else's pid
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass

    def oom_killed(self) -> bool:
        for d, lab in self.dirs:
            if "cgroup-memory" not in lab:
                continue
            for fname in ("memory.oom_control", "memory.events"):
                try:
                    text = (d / fname).read_text()
                except OSError:
                    continue
                m = re.search(r"^oom_kill (\d+)", text, re.M)
                if m and int(m.group(1)) > 0:
                    return True
        return False

    def remove(self) -> None:
        deadline = time.monotonic() + 2.0
        for d, _ in self.dirs:
            while not _rmdir(d) and time.monotonic() < deadline:
                self.kill()
                time.sleep(0.01)
        self.dirs = []


class Freezer:
    """Stop and continue every process of a run at once; ``freeze`` returns once they are all stopped.

    cgroup v2: ``cgroup.freeze``, done when ``cgroup.events`` reads "frozen 1"; v1: the freezer
    controller's ``freezer.state``, done when it reads FROZEN. The kernel stops every thread
    wherever it runs, and no signal the process can catch or block is involved (SIGSTOP would
    show as a state change its own threads can watch, and it took 2.7 ms on this 2-core machine
    against 44 us for cgroup v2's freezer). The files stay open: a round freezes and thaws once.
    """

    def __init__(self, folder: Path):
        self.v2 = (folder / "cgroup.freeze").exists()
        control, state = ("cgroup.freeze", "cgroup.events") if self.v2 else ("freezer.state", "freezer.state")
        self._write = os.open(folder / control, os.O_WRONLY)
        self._read = os.open(folder / state, os.O_RDONLY)
        self._on, self._off = (b"1", b"0") if self.v2 else (b"FROZEN", b"THAWED")
        self._frozen = b"frozen 1" if self.v2 else b"FROZEN\n"

    def freeze(self, alive=lambda: True) -> bool:
        """Stop the run; True once every member is stopped, False if ``alive()`` turns False first."""
        try:
            os.write(self._write, self._on)
            spins = 0
            while self._frozen not in os.pread(self._read, 4096, 0):
                spins += 1
                if spins % 64 == 0 and not alive():
                    return False
        except OSError:  # the cgroup went with its run
            return False
        return True

    def thaw(self) -> None:
        try:
            os.write(self._write, self._off)
        except OSError:  # the cgroup is gone with its run
            pass

    def close(self) -> None:
        for fd in (self._write, self._read):
            try:
                os.close(fd)
            except OSError:
                pass


def _rmdir(d: Path) -> bool:
    try:
        d.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _cgroup_mounts() -> tuple[dict[str, Path], Path | None]:
    v1: dict[str, Path] = {}
    v2: Path | None = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            fields, rest = pre.split(), post.split()
            if len(fields) < 5 or len(rest) < 3:
                continue
            mnt = Path(_unescape(fields[4]))
            if rest[0] == "cgroup2" and v2 is None:
                v2 = mnt
            elif rest[0] == "cgroup":
                for opt in rest[2].split(","):
                    if opt in ("pids", "memory", "cpuset", "freezer"):
                        v1.setdefault(opt, mnt)
    return v1, v2


def _own_cgroups() -> dict[str, str]:
    """controller -> our cgroup path ("" for cgroup v2)."""
    out: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            parts = line.rstrip("\n").split(":", 2)
            if len(parts) != 3:
                continue
            for ctrl in parts[1].split(",") if parts[1] else [""]:
                out[ctrl] = parts[2]
    return out


def _unescape(path: str) -> str:
    """Undo /proc/self/mountinfo's octal escapes (\\040 for a space, ...).

    The shim (env_pool/isolation/sandbox_shim.py) has its own copy: it imports nothing from here.
    """
    parts = path.split("\\")
    out = [parts[0]]
    for part in parts[1:]:
        if len(part) >= 3 and all(c in "01234567" for c in part[:3]):
            out.append(chr(int(part[:3], 8)) + part[3:])
        else:
            out.append("\\" + part)
    return "".join(out)
