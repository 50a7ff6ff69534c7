"""Which code the candidate's CPUs ran during its rounds: sampled by the kernel, read by the harness.

TRUSTED SIDE (used by env_pool/trusted/harness.py). The in-process fallback detector (guards.py) lives
where the candidate can switch it off; this one does not. The harness opens one perf event per
server CPU (``perf_event_open``, a software cpu-clock event, pid -1: every task on that CPU),
and the kernel writes a sample (pid, instruction pointer, time) into a ring buffer that only
the harness maps, at intervals redrawn at random (mean ``PERIOD_NS``). The candidate is pinned to those CPUs (the sandbox's
affinity, which its seccomp filter stops it from widening), so every instruction it runs is in
reach of the samples, whichever thread or native code runs it. The kernel also records every
new executable mapping (``mmap2`` records), so code mapped in during a round is attributed to
what it really is.

Each sample of the server's processes that falls inside a round's window is attributed to the
file its address maps, by the file's identity (device and inode, checked against a ``stat`` of
the same path made here), never by what the candidate's process says:

- ``own``: the files sealed before the server starts, by inode: the candidate's ``kernel.so``
  (built by the trusted compiler) or its ``load_inline`` build (a known gap: that build ran in
  the candidate's own import step);
- ``runtime``: the interpreter and the system's runtime (libc, libm, libstdc++, libgomp, ctypes,
  the CUDA driver and runtime) and torch's glue (its Python bindings, libc10), from installed
  locations;
- ``torch``: torch's compute libraries (libtorch_cpu, libtorch_cuda: MKL and oneDNN included);
- ``library``: everything else (numpy and its BLAS, cuBLAS and cuDNN host code, any other
  installed library), and any code that is not an installed file: a copy in the scratch folder
  or a private /tmp, anonymous or unmapped memory;
- ``kernel``: the operating system (system calls, page faults): counted, never blamed.

The verdict (``judge``, on every round but a phase's first): a library fallback is library code
above ``LIBRARY_SHARE`` of the samples or above ``FLOOR_NS`` a round; a torch fallback (CPU
only) is the median round's torch time beyond the same server's null phase by more than
``TORCH_FLOOR_NS`` (a legitimate forward spends a little time in torch: ``torch.empty`` for its
outputs, the dispatcher).

The candidate cannot make new code look like its own: its seccomp filter (env_pool/candidate/seccomp.py)
refuses anonymous executable memory, ``mprotect`` to executable, ``memfd_create`` and
``mremap``, so code it can run is a file mapping, and the kernel names the file in a record
that a second event per CPU writes for the whole phase.

What this does not see: work done on a GPU (only the host code that launched it: a cuBLAS call
spends its host time in libcublas, a CUDA graph replay almost none), and machine code copied
into ``kernel.so`` itself (through ``.incbin`` of a file visible to the compiler, or a write to
``/proc/self/mem``), which counts as the candidate's own.
"""
from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import platform
import random
import re
import stat
import statistics
import struct
import sys
from bisect import bisect_right
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from env_pool.build.compile import EXTENSIONS
from tasks.rules import STRICT, Rules

PERIOD_NS = 100_000  # mean time between samples on each server CPU (the period is redrawn at random: see reperiod)
MIN_PERIOD_NS = 20_000  # the shortest period drawn (each sample interrupts the CPU for microseconds)
RING_PAGES = 256  # 1 MiB per CPU: ~3 s of samples; drained while the harness waits on a round, and after it
LIBRARY_SHARE = 0.02  # more library samples than this fraction of a phase's (at least LIBRARY_MIN), or ...
LIBRARY_MIN = 3
FLOOR_NS = 200_000  # ... library time above this a round, is a library fallback
TORCH_FLOOR_NS = 500_000  # torch time a round beyond the null phase's, above this (and TORCH_SLACK), is torch computing
TORCH_SLACK = 0.25  # torch time may exceed the null phase's by this fraction of it (the output copies' noise)

_NR = {"x86_64": 298, "aarch64": 241}
_PAGE = mmap.PAGESIZE
_IOC_ENABLE, _IOC_DISABLE = 0x2400, 0x2401
_SOFTWARE, _CPU_CLOCK, _DUMMY = 1, 0, 9
_IOC_PERIOD = 0x40082404  # _IOW('$', 4, __u64)
_SAMPLE_IP, _SAMPLE_TID, _SAMPLE_TIME = 1, 2, 4
# attr flag bits: disabled(0) mmap(8) sample_id_all(18) mmap2(23) use_clockid(25)
_FLAGS = (1 << 0) | (1 << 8) | (1 << 18) | (1 << 23) | (1 << 25)
_CLOCK_MONOTONIC = 1  # the clock of time.perf_counter_ns, so samples line up with the harness's rounds
_RECORD_LOST, _RECORD_SAMPLE, _RECORD_MMAP2 = 2, 9, 10
_CPUMODE_MASK, _CPUMODE_KERNEL = 7, 1
_HEAD, _TAIL = 1024, 1032  # offsets of data_head and data_tail in struct perf_event_mmap_page

CATEGORIES = ("own", "runtime", "torch", "library", "kernel")
_RUNTIME = re.compile(r"^(python[\d.]*|libpython[\d.]+.*|ld-linux.*|ld-.*\.so.*|lib(c|m|dl|rt|pthread|util|resolv|"
                      r"stdc\+\+|gcc_s|gomp|iomp5|ffi|z|bz2|lzma|crypt|uuid|expat|ssl|crypto)([-.].*)?\.so.*|"
                      r"libgomp-[0-9a-f]+\.so.*|lib(cuda|cudart|nvidia-[\w-]+|nvrtc)\.so.*|"
                      r"_cmsgpack.*\.so|_packer.*\.so|_unpacker.*\.so)$")  # the stdlib's own: _DYNLOAD
# Torch's compute lives in libtorch_cpu / libtorch_cuda (MKL and oneDNN linked in). Its Python
# bindings (libtorch_python, torch._C) and its core (libc10: allocator, dispatch keys) compute
# nothing: they are the glue every legitimate forward goes through, and count as runtime.
_TORCH = re.compile(r"^(libtorch|libtorch_cpu|libtorch_cuda[\w-]*|libtorch_global_deps|libcaffe2[\w-]*)\.so.*$")
_TORCH_GLUE = re.compile(r"^(libtorch_python|libc10[\w-]*|libshm|_C\.cpython[\w.-]*)\.so.*$")
_PSEUDO_RUNTIME = ("[vdso]", "[vsyscall]", "[uprobes]")
_DYNLOAD = os.path.join(os.path.dirname(os.__file__), "lib-dynload")  # the base install's, also from a venv


class SamplerUnavailable(RuntimeError):
    """The kernel would not open the sampler here (permissions, seccomp, no perf support)."""


@dataclass
class Sample:
    time: int
    pid: int
    ip: int
    kernel: bool
    cpu: int = 0  # the index of the CPU (its ring) it was taken on


@dataclass
class Mapping:
    """An executable mapping of a process, from /proc/PID/maps or the kernel's mmap2 record."""

    start: int
    end: int
    dev: tuple[int, int]
    inode: int
    path: str
    time: int = 0  # 0: present when the maps were read


def _attr(config: int) -> bytes:
    attr = bytearray(128)
    struct.pack_into("IIQQQQQ", attr, 0, _SOFTWARE, 128, config, PERIOD_NS,
                     _SAMPLE_IP | _SAMPLE_TID | _SAMPLE_TIME, 0, _FLAGS)
    struct.pack_into("i", attr, 92, _CLOCK_MONOTONIC)
    return bytes(attr)


class CpuSampler:
    """Per CPU, opened by (and readable only by) this process: a sampling event, on from GO to DONE
    of each round, and a recorder of new executable mappings (a dummy event), on for whole phases:
    a mapping changed between rounds (code swapped back under another file's name) is recorded too."""

    def __init__(self, cpus: list[int]):
        self.fds: list[int] = []  # sampling events
        self.recorders: list[int] = []
        self.rings: list[mmap.mmap] = []
        self.lost = 0
        self.random = random.SystemRandom()
        try:
            for cpu in cpus:
                self.fds.append(self._open(_CPU_CLOCK, cpu))
                self.recorders.append(self._open(_DUMMY, cpu))
        except BaseException:
            self.close()
            raise

    def _open(self, config: int, cpu: int) -> int:
        nr = _NR.get(platform.machine())
        if nr is None:
            raise SamplerUnavailable(f"no perf_event_open number for {platform.machine()}")
        libc = ctypes.CDLL(None, use_errno=True)
        attr = ctypes.create_string_buffer(_attr(config), 128)
        fd = libc.syscall(ctypes.c_long(nr), attr, ctypes.c_int(-1), ctypes.c_int(cpu), ctypes.c_int(-1), ctypes.c_ulong(0))
        if fd < 0:
            err = ctypes.get_errno()
            raise SamplerUnavailable(f"perf_event_open(cpu {cpu}): {os.strerror(err)} (kernel.perf_event_paranoid is "
                                     f"{_paranoid()}; the harness needs CAP_PERFMON or root, and perf_event_open "
                                     "allowed by its container)")
        self.rings.append(mmap.mmap(fd, (1 + RING_PAGES) * _PAGE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))
        return fd

    def enable(self, on: bool) -> None:
        """Sample from GO to DONE only: between rounds (the harness's checks, seconds) the rings would overflow."""
        for fd in self.fds:
            if on:
                self._reperiod(fd)
            fcntl.ioctl(fd, _IOC_ENABLE if on else _IOC_DISABLE, 0)

    def record_mappings(self, on: bool) -> None:
        """Record new executable mappings for a whole phase, rounds and the gaps between them."""
        for fd in self.recorders:
            fcntl.ioctl(fd, _IOC_ENABLE if on else _IOC_DISABLE, 0)

    def reperiod(self) -> None:
        """Redraw every event's period: the sample times must not be predictable.

        A fixed period is a clock the candidate can read (each sample is a visible pause): the
        candidate that runs a library only between ticks gets no library sample (corpus rt2_tick_dodge).
        Redrawn from an exponential distribution at random moments (the harness's polls), the
        next sample's time is unknown to the candidate, whatever it saw.
        """
        for fd in self.fds:
            self._reperiod(fd)

    def _reperiod(self, fd: int) -> None:
        period = MIN_PERIOD_NS + int(self.random.expovariate(1.0 / (PERIOD_NS - MIN_PERIOD_NS)))
        fcntl.ioctl(fd, _IOC_PERIOD, struct.pack("Q", period))

    def half_full(self) -> bool:
        """Whether a ring is past half full (cheap: two words of each ring's header)."""
        for ring in self.rings:
            head, tail = struct.unpack_from("QQ", ring, _HEAD)
            if head - tail > RING_PAGES * _PAGE // 2:
                return True
        return False

    def drain(self) -> tuple[list[Sample], list[tuple[int, Mapping]]]:
        """Every record since the last drain: (samples, (pid, new executable mapping) in time order)."""
        samples: list[Sample] = []
        maps: list[tuple[int, Mapping]] = []
        for cpu, ring in enumerate(self.rings):
            head = struct.unpack_from("Q", ring, _HEAD)[0]
            tail = struct.unpack_from("Q", ring, _TAIL)[0]
            size = RING_PAGES * _PAGE
            data = _ring_bytes(ring, tail, head, size)
            self.lost += _parse(data, samples, maps, cpu)
            struct.pack_into("Q", ring, _TAIL, head)
        maps.sort(key=lambda m: m[1].time)
        return samples, maps

    def close(self) -> None:
        for ring in self.rings:
            ring.close()
        for fd in self.fds + self.recorders:
            os.close(fd)
        self.rings, self.fds, self.recorders = [], [], []


def _paranoid() -> str:
    try:
        return Path("/proc/sys/kernel/perf_event_paranoid").read_text().strip()
    except OSError:
        return "unreadable"


def _ring_bytes(ring: mmap.mmap, tail: int, head: int, size: int) -> bytes:
    if head - tail > size:  # cannot happen while the kernel respects data_tail; never read garbage
        return b""
    start, end = _PAGE + tail % size, _PAGE + head % size
    if head - tail == 0:
        return b""
    if end > start:
        return ring[start:end]
    return ring[start:_PAGE + size] + ring[_PAGE:end]


def _parse(data: bytes, samples: list[Sample], maps: list[tuple[int, Mapping]], cpu: int = 0) -> int:
    """Append the records in ``data`` (CPU ``cpu``'s ring); returns the count of samples the kernel lost."""
    lost, pos = 0, 0
    while pos + 8 <= len(data):
        kind, misc, size = struct.unpack_from("IHH", data, pos)
        if size < 8:
            break
        body = pos + 8
        if kind == _RECORD_SAMPLE:
            ip, pid, _tid, when = struct.unpack_from("QIIQ", data, body)
            samples.append(Sample(when, pid, ip, (misc & _CPUMODE_MASK) == _CPUMODE_KERNEL, cpu))
        elif kind == _RECORD_MMAP2:
            pid, _tid, addr, length, _pgoff, major, minor, inode, _gen, _prot, _flags = struct.unpack_from(
                "IIQQQIIQQII", data, body)
            name_at = body + 64
            raw = data[name_at:pos + size - 16]  # sample_id (pid, tid, time) closes the record
            path = os.fsdecode(raw.split(b"\0", 1)[0])
            when = struct.unpack_from("Q", data, pos + size - 8)[0]
            maps.append((pid, Mapping(addr, addr + length, (major, minor), inode, path, when)))
        elif kind == _RECORD_LOST:
            lost += struct.unpack_from("QQ", data, body)[1]
        pos += size
    return lost


def read_maps(pid: int) -> list[Mapping]:
    """The executable mappings of ``pid``, as the kernel shows them to this process."""
    out = []
    try:
        # As bytes, decoded as the OS would: a path that is not UTF-8 (the candidate names its files)
        # raised UnicodeDecodeError here, which the harness reported as its own fault, infra, so a
        # failing candidate's trajectory was dropped instead of scored (corpus rt3_maps_undecodable_infra).
        text = os.fsdecode(Path(f"/proc/{pid}/maps").read_bytes())
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5 or "x" not in parts[1]:
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        major, minor = (int(x, 16) for x in parts[3].split(":"))
        out.append(Mapping(start, end, (major, minor), int(parts[4]), parts[5] if len(parts) > 5 else ""))
    return out


class AddressSpaces:
    """Each server process's executable mappings, from its maps plus the kernel's later records."""

    def __init__(self) -> None:
        self.base: dict[int, tuple[list[int], list[Mapping]]] = {}  # per pid: sorted starts, mappings
        self.later: dict[int, list[Mapping]] = {}  # from mmap2 records, in time order (few)

    def load(self, pids: set[int]) -> None:
        for pid in pids:
            maps = sorted(read_maps(pid), key=lambda m: m.start)
            self.base[pid] = ([m.start for m in maps], maps)

    def add(self, pid: int, mapping: Mapping) -> None:
        self.later.setdefault(pid, []).append(mapping)

    def lookup(self, pid: int, ip: int, when: int) -> Mapping | None:
        """The newest mapping that covered ``ip`` at ``when`` (a later mapping over the same range wins)."""
        for m in reversed(self.later.get(pid, ())):
            if m.start <= ip < m.end and m.time <= when:
                return m
        starts, maps = self.base.get(pid, ([], []))
        i = bisect_right(starts, ip) - 1
        return maps[i] if i >= 0 and ip < maps[i].end else None


@dataclass
class CodeIdentity:
    """What the harness knows, on its own, of the files the candidate may run as its own code."""

    own_files: set[tuple[int, int]]  # (st_dev, st_ino) of kernel.so and the load_inline build's libraries
    installed: tuple[str, ...]  # prefixes the runtime, torch and libraries must be installed under
    scratch: Path
    held: list[int] = field(default_factory=list)  # open fds of the own files: their inode numbers cannot be reused
    rules: Rules = STRICT  # the rules in force: an installed library they allow (cuBLAS under the paper's) counts as own
    _seen: dict = field(default_factory=dict)

    @classmethod
    def for_scratch(cls, scratch: Path, rules: Rules = STRICT) -> "CodeIdentity":
        """Taken before the candidate's server starts, of the files sealed by then (evaluate.py's
        seal_kernel): kernel.so, and the libraries of a load_inline build (by inode, never by
        folder: a candidate can copy OpenBLAS into the extensions folder at run time, corpus
        rt2_fake_extension). They stay open here until ``close``: a candidate that unlinks one and writes a
        library in its place gets a new inode number, never the old one back (a freed inode's
        number is reused at once on ext4)."""
        own, held = set(), []
        try:
            for path in own_libraries(scratch):
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
                held.append(fd)
                st = os.fstat(fd)
                own.add((st.st_dev, st.st_ino))
        except BaseException:
            for fd in held:  # a failure here must not leave the harness holding them
                os.close(fd)
            raise
        prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
        prefixes |= {os.path.realpath(p) for p in sys.path if p and ("site-packages" in p or "dist-packages" in p)}
        prefixes |= {"/usr", "/lib", "/lib64", "/lib32", "/opt", "/bin", "/sbin"}
        return cls(own, tuple(sorted(prefixes)), scratch, held, rules)

    def close(self) -> None:
        for fd in self.held:
            os.close(fd)
        self.held = []

    def category(self, mapping: Mapping | None) -> tuple[str, str]:
        """(category, a short label for messages) of the code at a sampled address (remembered per mapping)."""
        key = None if mapping is None else (mapping.start, mapping.inode, mapping.path, mapping.time)
        if key not in self._seen:
            self._seen[key] = self._category(mapping)
        return self._seen[key]

    def _category(self, mapping: Mapping | None) -> tuple[str, str]:
        if mapping is None:
            return "library", "unmapped memory"
        path = mapping.path
        if path in _PSEUDO_RUNTIME:
            return "runtime", path
        if not path.startswith("/"):
            return "library", f"anonymous memory {path}".strip()
        ident = _file_id(path)
        if ident is None or not _same_file(ident, mapping):
            return "library", f"{path} (not the file installed at that path)"
        if ident in self.own_files:
            return "own", Path(path).name
        if _under(path, str(self.scratch)) or not any(_under(path, p) for p in self.installed):
            return "library", f"{path} (not an installed library)"
        name = Path(path).name
        if _TORCH.match(name):
            return "torch", name
        if self.rules.allows(name):  # an installed copy the rules allow (never torch, never one in the scratch folder)
            return "own", f"{name} (allowed by the {self.rules.name} rules)"
        if _RUNTIME.match(name) or _TORCH_GLUE.match(name) or _under(path, _DYNLOAD) or os.path.realpath(path) == os.path.realpath(sys.executable):
            return "runtime", name
        return "library", _short(path)


MAX_OWN_LIBRARIES = 64  # a load_inline build leaves one library per extension: more is not a build


class TooManyLibraries(ValueError):
    """The build left more libraries than a build makes (25,000 of them would take a descriptor
    each in the harness until it had none left for anything else: corpus rt3_own_library_fd_exhaustion)."""


def own_libraries(scratch: Path) -> list[Path]:
    """The libraries in a scratch folder that count as the candidate's own code once sealed:
    kernel.so and what a load_inline build left (evaluate.py seals them, CodeIdentity holds them).

    Only regular files whose every folder is a real folder inside the scratch folder: a symlink
    ``.torch_extensions/lib -> torch/lib`` once made libtorch_cpu.so the candidate's "own" code
    (and had the worker seal torch's own libraries). Raises TooManyLibraries past MAX_OWN_LIBRARIES."""
    found = [scratch / "kernel.so"]
    extensions = scratch / EXTENSIONS
    if extensions.is_dir() and not extensions.is_symlink():
        for folder in sorted(extensions.iterdir()):
            if folder.is_dir() and not folder.is_symlink():
                found += sorted(p for p in folder.iterdir() if p.suffix == ".so")
    root = os.path.realpath(scratch)
    own = [p for p in found if not p.is_symlink() and p.is_file() and os.path.realpath(p).startswith(root + os.sep)]
    if len(own) > MAX_OWN_LIBRARIES:
        raise TooManyLibraries(f"the build left {len(own)} libraries (at most {MAX_OWN_LIBRARIES}): not a build's output")
    return own


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None


def _same_file(ident: tuple[int, int], mapping: Mapping) -> bool:
    """Whether the mapped file is the one the harness finds at its path: same inode, and same device
    unless the harness's view is an overlay (an anonymous device, major 0), whose maps show the backing one."""
    dev, inode = ident
    return inode == mapping.inode and (dev == os.makedev(*mapping.dev) or os.major(dev) == 0)


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def _short(path: str) -> str:
    parts = Path(path).parts
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts:
            return "/".join(parts[parts.index(anchor) + 1:])
    return path


@dataclass
class CodeLedger:
    """Attributed samples of one phase: counts and CPU time per category and label, over the rounds' windows.

    A sample's time is its CPU's share of the round: the round's window over the samples taken
    on that CPU in it (PhaseSampling.round_done). The period is redrawn at random (reperiod) and
    a drawn period holds for a while, so a count times the mean period put a 2 ms torch softmax
    anywhere from 0.6 to 7 ms, and torch in most timed rounds passed one run in four.
    """

    counts: Counter = field(default_factory=Counter)
    time_ns: Counter = field(default_factory=Counter)  # CPU time per category, estimated as above
    labels: dict[str, Counter] = field(default_factory=lambda: {c: Counter() for c in CATEGORIES})
    torch_rounds: list[float] = field(default_factory=list)  # torch CPU time (ns) of each judged round, in order
    lost: int = 0  # samples the kernel could not write (a full ring): too many and the phase cannot be judged

    @property
    def rounds(self) -> int:
        return len(self.torch_rounds)

    def start_round(self) -> None:
        """The samples added from here on are the next judged round's."""
        self.torch_rounds.append(0)

    @property
    def total(self) -> int:
        """Samples in user code: the kernel's time (page faults, system calls) is nobody's compute."""
        return sum(n for c, n in self.counts.items() if c != "kernel")

    def add(self, category: str, label: str, ns: float = PERIOD_NS) -> None:
        """One sample of ``category``, standing for ``ns`` of CPU time."""
        self.counts[category] += 1
        self.time_ns[category] += ns
        self.labels[category][label] += 1
        if category == "torch" and self.torch_rounds:
            self.torch_rounds[-1] += ns

    def to_dict(self) -> dict:
        return {"judged_rounds": self.rounds, "samples": dict(self.counts), "lost": self.lost, "period_ns": PERIOD_NS,
                "torch_ms": [round(ns / 1e6, 3) for ns in self.torch_rounds],
                "top": {c: self.labels[c].most_common(3) for c in CATEGORIES if self.labels[c]}}


class PhaseSampling:
    """The samples of one server's phase, attributed round by round (the sampler already enabled).

    The first round is attributed but not judged when later ones follow: it pays one-off costs
    (lazy imports in torch and the server's detector: seconds of interpreter time) that would
    dilute everything after it. Every round computes its own fresh outputs, so a fallback has
    to show in the later rounds too.
    """

    def __init__(self, sampler: CpuSampler, pids: set[int], identity: CodeIdentity, rounds: int):
        self.sampler = sampler
        self.pids = pids
        self.identity = identity
        self.spaces = AddressSpaces()
        sampler.drain()  # what came before the phase (another phase's rounds) is not this phase's
        self.lost = sampler.lost
        self.spaces.load(pids)  # after enabling: a mapping made from here on has its mmap2 record
        self.ledger = CodeLedger()
        self.skip_first = rounds > 1
        self.pending: tuple[list[Sample], list[tuple[int, Mapping]]] = ([], [])

    def poll(self) -> None:
        """Called while the harness waits on a round: redraw the periods, drain a ring before it fills."""
        self.sampler.reperiod()
        if self.sampler.half_full():
            samples, maps = self.sampler.drain()
            self.pending[0].extend(samples)
            self.pending[1].extend(maps)

    def round_done(self, start_ns: int, end_ns: int) -> None:
        """Attribute the samples of one round's window [start_ns, end_ns], from GO to DONE (called after the round)."""
        samples, maps = self.sampler.drain()
        samples, maps = self.pending[0] + samples, self.pending[1] + maps
        self.pending = ([], [])
        for pid, mapping in maps:
            if pid in self.pids:
                self.spaces.add(pid, mapping)
        judged = not self.skip_first
        self.skip_first = False
        lost, self.lost = self.sampler.lost - self.lost, self.sampler.lost
        self.ledger.lost += lost  # whichever round lost them (the kernel reports a loss late): counted, never blamed
        if not judged:
            return
        self.ledger.start_round()
        for s, ns in cpu_time_shares(samples, start_ns, end_ns, self.pids):
            if s.kernel:
                self.ledger.add("kernel", "kernel", ns)
            else:
                self.ledger.add(*self.identity.category(self.spaces.lookup(s.pid, s.ip, s.time)), ns)


def cpu_time_shares(samples: list[Sample], start_ns: int, end_ns: int, pids: set[int]) -> list[tuple[Sample, float]]:
    """The samples of ``pids`` in the window, each with the CPU time it stands for: the window over
    the samples its CPU took in it, every process's counted (an idle CPU is sampled too).

    Unbiased whatever period was in force; a count times the mean period is not (CodeLedger).
    """
    window = [s for s in samples if start_ns <= s.time <= end_ns]
    per_cpu = Counter(s.cpu for s in window)
    return [(s, (end_ns - start_ns) / per_cpu[s.cpu]) for s in window if s.pid in pids]


def per_round_ns(ledger: CodeLedger, category: str) -> float:
    return ledger.time_ns[category] / max(1, ledger.rounds)


def torch_round_ns(ledger: CodeLedger) -> float:
    """The median judged round's torch time.

    A median, not a mean: torch computing the result does so in most rounds, while a legitimate
    round now and then pays a one-off millisecond in torch (one round of seven, on the CI's 2
    cores, held 1.5 ms of it: over four verify rounds, a mean flagged gelu_omp and scaled_softmax).
    """
    return statistics.median(ledger.torch_rounds) if ledger.torch_rounds else 0.0


def timed_torch_ns(ledger: CodeLedger, timed_ns: Sequence[int]) -> float:
    """The mean torch time of the timed rounds the timing's median rests on: those at or below it.

    ``timed_ns`` are the last rounds' times, in order. Torch in 5 of 9 timed rounds, faster than
    the candidate's own kernel, makes the median time torch's while 5 of 16 judged rounds leave
    the median judged round torch-free. The median torch time of the timed rounds saw it, but as
    the least of the five torch rounds' estimates: one undersampled round (0.89 ms of a 1.5 ms
    softmax) let it pass on the CI. A mean over the faster half is five estimates' worth.
    """
    cut = statistics.median_low(timed_ns)
    torch = ledger.torch_rounds[-len(timed_ns):]
    fast = [t for t, ns in zip(torch, timed_ns) if ns <= cut]
    return statistics.fmean(fast) if fast else 0.0


def judge(ledger: CodeLedger, null: CodeLedger | None, torch_rule: bool = True, timed_ns: Sequence[int] = ()) -> list[dict]:
    """Violations (guard dicts, as the server's guards report them) from a candidate phase's samples.

    Library code: above LIBRARY_SHARE of the samples, or above FLOOR_NS a round (padding the
    rounds with other work must not hide it). Torch code: a legitimate round spends time in
    torch too (its outputs' allocation, the server's copy of them into the shared slots), which
    the ``null`` phase of the same server measured before the candidate's code was loaded; torch
    time beyond that, by more than TORCH_FLOOR_NS and TORCH_SLACK of it, is torch computing: in
    the median judged round (torch_round_ns), or in the timed rounds (``timed_ns``, their times in
    full mode) that the timing's median rests on (timed_torch_ns). Not on a
    GPU (``torch_rule`` off): there the host mostly waits for the device, and the wait counts
    for whichever library waits, so host time says nothing of which code computed.
    """
    total = ledger.total
    if total == 0 or ledger.rounds == 0:
        return []
    out = []
    library = ledger.counts["library"]
    if library >= LIBRARY_MIN and (library > LIBRARY_SHARE * total or per_round_ns(ledger, "library") > FLOOR_NS):
        top = ", ".join(f"{name} ({n * 100 // total}%)" for name, n in ledger.labels["library"].most_common(3))
        out.append({"guard": "library_fallback",
                    "reason": f"about {per_round_ns(ledger, 'library') / 1e6:.2f} ms of each round ({library * 100 // total}% "
                              f"of its CPU time) ran in library code, not in your kernel: {top}. A library computing "
                              "for you is a fallback (SKILL.md): compute in your own kernel's code"})
    glue = torch_round_ns(null) if null is not None else 0.0
    extra = max(torch_round_ns(ledger), timed_torch_ns(ledger, timed_ns) if timed_ns else 0.0) - glue
    if torch_rule and extra > TORCH_FLOOR_NS + TORCH_SLACK * glue:
        top = ", ".join(f"{name} ({n * 100 // total}%)" for name, n in ledger.labels["torch"].most_common(2))
        out.append({"guard": "torch_fallback",
                    "reason": f"about {extra / 1e6:.2f} ms of each round ran inside torch's own libraries ({top}) "
                              "beyond what serving the outputs takes: torch computed the result, not your kernel "
                              "(seen by the harness's CPU sampler, whatever the process did to its own detectors)"})
    return out


BUILD_COMMS = ("cc1plus", "cc1", "g++", "gcc", "c++", "nvcc", "cicc", "ptxas", "fatbinary", "nvlink", "ld", "as", "ninja")
DISTURBED_SHARE = 0.1  # a round is disturbed when builds ran on the timing CPUs for this share of it, or more
DISTURBED_ROUNDS = 0.25  # baselines are not kept when more than this share of their timed rounds was disturbed


class Disturbance:
    """Builds that ran on the timing CPUs (the servers' and the harness's) during a phase's rounds.

    A build (a compiler, or any process in a candidate's sandbox: an import step, another
    candidate's server) on those CPUs slows the clock or the server that is being timed. For a
    candidate that only costs its own evaluation, but a task's baselines are kept for the
    worker's life: a compile of ~80 s beside a task's first baselines left them cached at 3x
    their quiet time, and an honest kernel two milestones up. The worker keeps its
    builds off those CPUs while baselines are timed (env_pool/evaluate.py's BuildGate); this
    is the check that it worked, whatever started the build.
    """

    def __init__(self, sampler: CpuSampler, own: set[int]):
        self.sampler = sampler
        self.own = own | {os.getpid()}
        sampler.drain()
        self.rounds = 0
        self.disturbed = 0
        self.culprits: Counter = Counter()
        self.ledger = None  # no code is attributed (PhaseSampling's place in a round)
        self._kinds: dict[int, str] = {}  # pid -> "build" or "" (anything else is only load)

    def poll(self) -> None:
        self.sampler.reperiod()
        if self.sampler.half_full():
            self._count(self.sampler.drain()[0], 0, 0)

    def round_done(self, start_ns: int, end_ns: int) -> None:
        self.rounds += 1
        builds = self._count(self.sampler.drain()[0], start_ns, end_ns)
        if builds * PERIOD_NS > DISTURBED_SHARE * (end_ns - start_ns):  # a build on one CPU for that share of the round
            self.disturbed += 1

    def _count(self, samples: list[Sample], start_ns: int, end_ns: int) -> int:
        builds = 0
        for s in samples:
            if s.pid <= 0 or s.pid in self.own or (end_ns and not start_ns <= s.time <= end_ns):
                continue
            name = self._kind(s.pid)
            if name:
                builds += 1
                self.culprits[name] += 1
        return builds

    def _kind(self, pid: int) -> str:
        """A build's name for ``pid`` ("" for anything else), looked up once per process."""
        if pid not in self._kinds:
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                sandboxed = "cuda-agent-sandbox" in Path(f"/proc/{pid}/cgroup").read_text()
            except OSError:
                comm, sandboxed = "", False
            self._kinds[pid] = comm if sandboxed or comm in BUILD_COMMS else ""
        return self._kinds[pid]

    @property
    def too_disturbed(self) -> bool:
        return self.rounds > 0 and self.disturbed > DISTURBED_ROUNDS * self.rounds

    def describe(self) -> str:
        names = ", ".join(f"{name} ({n} samples)" for name, n in self.culprits.most_common(3))
        return f"{self.disturbed} of {self.rounds} rounds had builds on the timing CPUs ({names})"
