"""Run one untrusted program in an isolated child process, and always get an outcome back.

The environment runs every candidate (the agent's kernels, the runner that imports them) through
``run_sandboxed``. The candidate is hostile: a crash, a hang, a memory bomb, a fork bomb, a
daemon that outlives its evaluation or a network call must cost one evaluation, never the worker.
Candidate misbehaviour is reported in a ``SandboxOutcome`` (``failure`` says which kind); only
the sandbox's own faults (the program cannot be started, a required protection is missing)
raise ``SandboxError``, which the caller maps to an ``infra`` failure.

How one run is put together (parent = the worker calling ``run_sandboxed``):

    parent ── shim (env_pool/isolation/sandbox_shim.py, run as ``python -I -S -c TEXT CONFIG``)
                 │  new session and process group; joins fresh cgroups; pins itself to the
                 │  run's CPUs; unshares the network, IPC and mount namespaces and builds the
                 │  filesystem view (read-only root, or a fresh root of chosen paths only;
                 │  writable scratch, private /tmp, /dev and /dev/shm, hidden paths); then
                 │  unshares the PID namespace and forks:
                 ├── init  (PID 1 of the new PID namespace: only reaps orphans)
                 └── child (PID 2): mounts a fresh /proc, sets rlimits, drops every capability,
                               execs ``argv``

The shim does this work (not a ``preexec_fn``): ``preexec_fn`` is unsafe when the worker has
threads, and the PID namespace needs a process that stays outside it to tear it down. When the
child exits, the shim SIGKILLs init and the kernel then kills everything left in the namespace
(daemons, ``setsid`` escapes, fork bombs). The parent meanwhile enforces the wall clock, polls
the tree's resident memory, and at the end kills the process group, every process it saw and
the cgroups, so nothing survives even where a namespace could not be created.

The trusted side, one job a module: this one (the limits, the run's configuration, the wall
clock and the verdict), env_pool/isolation/cgroups.py (the run's cgroups), env_pool/isolation/sandbox_watchdog.py
(the tree's membership, memory, CPU moves and kill), env_pool/isolation/sandbox_channels.py (the pipes).
env_pool/isolation/sandbox_shim.py is the inside: self-contained, it imports nothing of this package;
its note lists every field of the configuration it accepts. The sandboxed program's end of
the result channel is env_pool/isolation/result_channel.py.

What the parent takes from the other side, and how: the shim's status lines (JSON, malformed
ones skipped; only the shim and the child before exec hold that pipe; see the shim's note),
stdout and stderr (one pipe, read concurrently and trimmed to head + tail), the result (a
separate inherited pipe whose fd number is in ``RESULT_FD_ENV``, bounded; the candidate runs in
the program's process and could write there too, so whoever reads the result must validate
it), and what the kernel says about the tree (see sandbox_watchdog). stdin carries the payload
(written from a thread, so a child that never reads cannot block the parent). A program must
read its payload and open the result channel *before* it runs untrusted code.

Every protection is applied where the machine allows and fails soft: what was applied is
listed in ``SandboxOutcome.isolation``, and a label is only listed when the protection is in
force (checked where it can be: "readonly-root" after statvfs says so).
``SandboxLimits.required_isolation`` turns chosen ones into hard requirements (the run is
refused, ``SandboxError``, when one is missing). Untrusted code requires at least
``UNTRUSTED_ISOLATION``.
"""
from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from env_pool.isolation.cgroups import Freezer, RunCgroups
from env_pool.isolation.result_channel import RESULT_FD_ENV
from env_pool.isolation.sandbox_channels import BoundedBytes, HeadTail, drain, feed
from env_pool.isolation.sandbox_watchdog import ExitWaiter, TreeWatch

# Protections the parent applies itself, always present in SandboxOutcome.isolation.
_PARENT_SIDE = ("session", "rss-watchdog", "wall-clock", "tree-kill")

# What every run of untrusted code requires (SandboxLimits.required_isolation): its own mount
# namespace with a read-only view (the bound-back checkout and venv included), the hidden paths
# hidden, no network, no capabilities, and a PID namespace (no host processes to read or signal,
# nothing that outlives the run). A machine that cannot give one of them refuses the run.
UNTRUSTED_ISOLATION = ("mountns", "readonly-root", "hidden-paths", "netns", "no-caps", "pidns")

# Environment variables copied from the worker into the child (everything else is dropped:
# the worker's environment may hold endpoints and API keys). CUDA device selection is only
# passed through to GPU runs; CPU runs get CUDA_VISIBLE_DEVICES="" and no /dev/nvidia* nodes.
_ENV_PASSTHROUGH = (
    "PATH", "LANG", "LC_ALL", "LC_CTYPE", "PYTHONPATH", "LD_LIBRARY_PATH", "CUDA_HOME",
    "CUDA_PATH", "TORCH_CUDA_ARCH_LIST", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
)
_ENV_GPU_PASSTHROUGH = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")

# Output that means the child ran out of memory on its own (RLIMIT_AS makes allocations fail
# instead of the watchdog killing): Python, numpy (_ArrayMemoryError), C++, torch, libc.
_OOM_TEXT = re.compile(r"MemoryError|std::bad_alloc|OutOfMemoryError|Cannot allocate memory")


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the candidate): the caller reports an ``infra`` failure."""


@dataclass
class SandboxLimits:
    # Wall-clock limit of the whole run: past it the process tree is SIGKILLed (timed_out).
    wall_s: float = 120.0
    # RLIMIT_CPU of each process: SIGXCPU at the limit, SIGKILL one second later (cpu_limited).
    # None: 2 x wall_s (a multi-threaded child may legitimately use more CPU than wall time).
    cpu_s: float | None = None
    # Resident memory of the whole process tree (sum of RSS, polled every poll_s; shared pages
    # count once per process, so this errs on the strict side): over it -> SIGKILL, out_of_memory.
    memory_mb: int = 8192
    # RLIMIT_AS (virtual memory) of each process, CPU-only runs: makes a huge allocation fail at
    # once (MemoryError) instead of racing the watchdog. `import torch` reserves ~0.8 GiB of
    # virtual memory and every thread's malloc arena up to 64 MiB more, hence the headroom.
    # None: memory_mb + 4096. Never applied with use_gpu: CUDA reserves terabytes of address space.
    address_space_mb: int | None = None
    # stdout+stderr kept: half from the head, half from the tail; the rest is counted and cut.
    max_output_chars: int = 8000
    # Result channel: more than this is drained and dropped (result None, noted in the output).
    max_result_bytes: int = 512 << 20
    # RLIMIT_FSIZE: the largest file the child may write (it gets EFBIG / SIGXFSZ past it).
    max_file_mb: int = 1024
    # RLIMIT_NOFILE.
    max_open_files: int = 4096
    # Processes + threads of the run, through the pids cgroup where one can be created.
    # RLIMIT_NPROC would be the portable tool, but the kernel never applies it to uid 0 (the
    # check in copy_process exempts INIT_USER), and the child runs as root here: /root is 0700
    # and holds the interpreter, so dropping to `nobody` is not an option. Without a pids cgroup
    # a fork bomb is bounded by the memory watchdog and the wall clock only.
    max_pids: int = 1024
    # Size of each private tmpfs (/tmp and /dev/shm): tmpfs pages are not in any process's RSS,
    # so without a bound a candidate could fill RAM past the watchdog.
    tmp_mb: int = 1024
    # False: the child gets a new network namespace with no interfaces up (not even loopback).
    allow_network: bool = False
    # With the network namespace: bring its loopback interface up (still no way out of the
    # namespace). Profilers such as ncu talk to their target process over localhost.
    loopback: bool = False
    # Capabilities the child keeps (names as in linux/capability.h, e.g. "CAP_SYS_ADMIN"); all
    # others are dropped. Any one of them weakens the sandbox: CAP_SYS_ADMIN undoes its mounts.
    keep_capabilities: tuple[str, ...] = ()
    # True: /dev/nvidia* are visible, CUDA_VISIBLE_DEVICES passes through, no RLIMIT_AS.
    use_gpu: bool = False
    # Paths the child must not see (the environment's expected outputs, seeds, reference code):
    # an empty read-only tmpfs is mounted over directories, /dev/null over files.
    hidden_paths: list[Path] = field(default_factory=list)
    # CPUs the run may use (os.sched_setaffinity of the shim before it forks, so the child and
    # every thread it starts inherit them; label "cpu-affinity"; plus cpuset.cpus of the run's
    # cgroup where a cpuset controller is there, "cgroup-cpuset"). The runner's seccomp filter
    # (env_pool/candidate/seccomp.py) refuses sched_setaffinity, so the candidate cannot widen them.
    # Empty: no restriction.
    cpus: tuple[int, ...] = ()
    # Non-empty: the child sees only these paths (bound read-only; symlinks resolved, and the
    # links on the way, /bin -> usr/bin say, recreated), plus its scratch, a private /tmp, a
    # minimal /dev and its own /proc, in a fresh root (pivot_root; label "visible-only"). Used
    # for the compiler: nothing of the project, the venv, /root or /work is there to #include.
    visible_paths: tuple[str, ...] = ()
    # Isolation names (see SandboxOutcome.isolation) without which the run must not start.
    required_isolation: tuple[str, ...] = ()
    # Isolation names not to apply: a knob for a machine where one of them breaks something
    # (compare outcomes with and without before trusting it). Parent-side ones always apply.
    skip_isolation: tuple[str, ...] = ()
    # Watchdog period.
    poll_s: float = 0.05

    @property
    def cpu_limit_s(self) -> float:
        return self.cpu_s if self.cpu_s is not None else 2.0 * self.wall_s

    @property
    def address_space_limit_mb(self) -> int | None:
        if self.use_gpu:
            return None
        return self.address_space_mb if self.address_space_mb is not None else self.memory_mb + 4096


@dataclass
class SandboxOutcome:
    returncode: int | None  # exit code when the child exited; None when a signal ended it
    signal_name: str | None  # "SIGSEGV", "SIGKILL", ... when a signal ended it
    timed_out: bool  # the wall-clock limit killed it
    out_of_memory: bool  # the memory watchdog or cgroup killed it, or it died of a failed allocation
    cpu_limited: bool  # RLIMIT_CPU ended it
    output: str  # stdout+stderr of the child, trimmed (head and tail kept, saying how much was cut)
    result: bytes | None  # what the child wrote on the result channel; None when it wrote nothing
    wall_s: float  # sandbox start to child exit, seconds
    isolation: list[str] = field(default_factory=list)  # protections applied: "netns", "pidns", ...
    cpu_time_s: float = 0.0  # user + system CPU of the reaped tree
    peak_memory_mb: float = 0.0  # highest RSS sum the watchdog saw

    @property
    def failure(self) -> str | None:
        """"timeout", "out_of_memory", "crash" or None (names as in results.FAILURE_KINDS).

        A clean exit (0) without a result is not a failure here: not every program answers on
        the result channel (a compiler does not). Callers that expect a result check it.
        """
        if self.timed_out or self.cpu_limited:
            return "timeout"
        if self.out_of_memory:
            return "out_of_memory"
        if self.signal_name is not None:
            return "crash"
        if self.returncode not in (0, None) and self.result is None:
            return "crash"
        if self.returncode is None:  # no status at all: the tree was torn down under it
            return "crash"
        return None


class WarmStart:
    """A run started ahead of its payload: give it to ``run_sandboxed`` in place of the bytes.

    The run does everything before reading its stdin (the sandbox, the program's imports, a CUDA
    context) and then waits. ``give`` moves its processes to their final CPUs, checks that every
    thread of every process is there, and only then writes the payload; the run's wall-clock
    limit counts from that moment. ``cancel`` ends a run that was never given one. ``pause``
    and ``resume`` stop and continue a run that has not been given its payload (its processes
    run only trusted code until then), so its start-up does not disturb a timed run on shared
    CPUs.
    """

    def __init__(self) -> None:
        self._given = threading.Event()
        self.payload = b""
        self.cpus: tuple[int, ...] = ()
        self.given_at: float | None = None
        self.cancelled = False
        self.members: Any = None  # set by run_sandboxed: the run's pids right now
        self.move_cpus: Any = None  # set by run_sandboxed: moves the run to given CPUs, True when it is all there
        self.freezer: Freezer | None = None  # set by run_sandboxed: stops and continues the whole run (cgroup-freeze); the caller closes it
        self.program_pid: Any = None  # set by run_sandboxed: the program's pid (this namespace's number), or None

    def give(self, payload: bytes, cpus: tuple[int, ...] = ()) -> None:
        self.payload, self.cpus = payload, tuple(cpus)
        self.given_at = time.monotonic()
        self.resume()
        self._given.set()

    def cancel(self) -> None:
        self.cancelled = True
        self.resume()
        self._given.set()

    @property
    def given(self) -> bool:
        return self._given.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._given.wait(timeout)

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        if self.members is None or (self.given and sig == signal.SIGSTOP):
            return
        for pid in self.members():
            try:
                os.kill(pid, sig)
            except OSError:
                pass


def run_sandboxed(
    argv: list[str],
    payload: bytes | WarmStart,
    scratch: Path,
    limits: SandboxLimits,
    env: dict[str, str] | None = None,
    hidden_paths: list[Path] | None = None,
    pass_fds: tuple[int, ...] = (),
    inherit_env: bool = True,
) -> SandboxOutcome:
    """Run ``argv`` in ``scratch`` under ``limits``; ``payload`` is its stdin.

    The child's environment is a few variables of the worker's (_ENV_PASSTHROUGH) plus ``env``;
    with ``inherit_env=False`` it is exactly ``env`` (and the result channel's variable).

    Returns whatever the child did; raises ``SandboxError`` only when the sandbox could not run
    it (the program cannot be executed, a required isolation is unavailable, the shim failed).
    ``pass_fds`` are inherited by the child under the same numbers (shared memory of the round
    protocol, env_pool/shared/rounds.py); the caller keeps and closes its own copies. A ``WarmStart``
    as the payload starts the run now and feeds it later, and tells its processes (see WarmStart:
    the harness's code sampler, env_pool/trusted/code_sampler.py, attributes their samples).
    """
    warm = payload if isinstance(payload, WarmStart) else None
    if not argv:
        raise ValueError("argv must not be empty")
    scratch = Path(scratch).resolve()
    (scratch / "tmp").mkdir(parents=True, exist_ok=True)
    cgroups = RunCgroups.create(limits.memory_mb, limits.max_pids, limits.cpus, limits.skip_isolation)
    pipes = _Pipes()
    child_env = _child_env(scratch, limits, env) if inherit_env else dict(env or {})
    child_env[RESULT_FD_ENV] = str(pipes.result_w)
    config = _shim_config(argv, scratch, limits, [*limits.hidden_paths, *(hidden_paths or [])], child_env, cgroups, pipes)
    t0 = time.monotonic()  # the wall clock of a run given its payload now (a warm one's starts when it is given)
    proc = _start_shim(config, scratch, child_env, pass_fds, pipes, cgroups)
    pid = proc.pid  # also the process group id (start_new_session)
    watch = TreeWatch(pid, cgroups)  # killing (watch.kill_tree): everything we know of, by every handle we have
    try:
        io = _RunIO(limits, pipes, warm, payload if warm is None else None)
        if warm is not None:
            io.tell(warm, watch, pid, cgroups)
        io.start()
        watch.watch_memory(limits.memory_mb << 20, limits.poll_s, io.init_pid, watching=lambda: warm is None or warm.given)
        ended = _await_end(proc, watch, warm, limits, io, t0)
        io.finish(watch)
        cgroup_oom = cgroups.oom_killed()
        cgroups.remove()  # the freezer's files stay open (their writes fail) until its owner closes it
    except BaseException:
        # Our own failure (or Ctrl-C) mid-run: the child's tree must not outlive it either.
        watch.kill_tree()
        if not watch.shim_reaped.is_set():
            try:
                os.waitpid(pid, os.WNOHANG)  # never block here: it may be stuck in the kernel
            except ChildProcessError:
                pass
        cgroups.remove()
        raise
    if warm is not None and warm.given and not warm.cancelled and warm.cpus and io.moved != [True]:
        raise SandboxError(f"could not move the run to CPUs {list(warm.cpus)}: a thread stayed elsewhere")
    return _classify(argv, limits, io, ended, proc.returncode, watch, cgroup_oom)


@dataclass
class _Ended:
    """How the shim ended, as the parent saw it."""

    timed_out: bool
    wall_s: float
    rusage: Any


class _Pipes:
    """The run's four pipes: the payload in, the output, the result channel and the shim's status out."""

    def __init__(self) -> None:
        self.in_r, self.in_w = os.pipe()
        self.out_r, self.out_w = os.pipe()
        self.result_r, self.result_w = os.pipe()
        self.status_r, self.status_w = os.pipe()

    def close_child_ends(self) -> None:
        for fd in (self.in_r, self.out_w, self.result_w, self.status_w):
            os.close(fd)

    def close_parent_ends(self) -> None:
        for fd in (self.in_w, self.out_r, self.result_r, self.status_r):
            os.close(fd)


def _shim_config(argv: list[str], scratch: Path, limits: SandboxLimits, hidden: list[Path], child_env: dict[str, str],
                 cgroups: RunCgroups, pipes: _Pipes) -> dict[str, Any]:
    """What the shim builds the run's isolation from (its fields: env_pool/isolation/sandbox_shim.py)."""
    visible = [os.path.abspath(p) for p in limits.visible_paths]
    return {
        "argv": list(argv),
        "scratch": str(scratch),
        "hidden": [str(Path(p).absolute()) for p in hidden],
        # A fresh root shows only the visible paths: nothing under /tmp is bound back there.
        "keep": [] if visible else _paths_to_keep(argv, child_env),
        "visible": visible,
        "cpus": sorted({int(c) for c in limits.cpus}),
        "allow_network": limits.allow_network,
        "use_gpu": limits.use_gpu,
        "loopback": limits.loopback,
        "keep_caps": [_CAPABILITIES[name] for name in limits.keep_capabilities],
        "tmp_mb": limits.tmp_mb,
        "rlimits": _rlimits(limits),
        "cgroups": cgroups.join_list(),
        "required": list(limits.required_isolation),
        "parent_side": list(_PARENT_SIDE),
        "skip": list(limits.skip_isolation),
        "result_fd": pipes.result_w,
        "status_fd": pipes.status_w,
        "parent_pid": os.getpid(),
    }


def _start_shim(config: dict[str, Any], scratch: Path, child_env: dict[str, str], pass_fds: tuple[int, ...],
                pipes: _Pipes, cgroups: RunCgroups) -> Any:
    """The shim started in a session of its own; the child's ends of the pipes closed here either way."""
    import subprocess

    shim_argv = [sys.executable, "-I", "-S", "-c", _shim_source(), json.dumps(config)]
    try:
        return subprocess.Popen(
            shim_argv, stdin=pipes.in_r, stdout=pipes.out_w, stderr=pipes.out_w, cwd=str(scratch), env=child_env,
            pass_fds=(pipes.result_w, pipes.status_w, *pass_fds), start_new_session=True, close_fds=True,
        )
    except OSError as exc:
        pipes.close_parent_ends()
        cgroups.remove()
        raise SandboxError(f"could not start the sandbox shim: {exc}") from exc
    finally:
        pipes.close_child_ends()


class _RunIO:
    """The parent's threads of one run: the payload in, the output and the result out, the shim's status messages."""

    def __init__(self, limits: SandboxLimits, pipes: _Pipes, warm: WarmStart | None, payload: bytes | None):
        self.pipes, self.warm, self.payload = pipes, warm, payload
        self.output = HeadTail(limits.max_output_chars)
        self.result = BoundedBytes(limits.max_result_bytes)
        self.status: dict = {}
        self.status_lock = threading.Lock()
        self._status_buf = bytearray()
        self.moved: list[bool] = []  # the feeder's verdict on the warm run's CPU move
        self.set_up = threading.Event()  # the shim has built the sandbox (or is gone): its CPUs may move now
        self.threads: list[threading.Thread] = []

    def tell(self, warm: WarmStart, watch: TreeWatch, pid: int, cgroups: RunCgroups) -> None:
        """What a warm run's owner may ask of it before and after it is given its payload."""
        warm.members = lambda: watch.members() | {pid}
        warm.move_cpus = watch.move_cpus
        warm.freezer = cgroups.freezer()
        warm.program_pid = lambda: self.status_value("child")

    def start(self) -> None:
        self.threads = [
            threading.Thread(target=self._feed_payload, daemon=True),
            threading.Thread(target=drain, args=(self.pipes.out_r, self.output.add), daemon=True),
            threading.Thread(target=drain, args=(self.pipes.result_r, self.result.add), daemon=True),
            threading.Thread(target=self._read_status, daemon=True),
        ]
        for t in self.threads:
            t.start()

    def status_value(self, key: str) -> Any:
        with self.status_lock:
            return self.status.get(key)

    def init_pid(self) -> int | None:
        return self.status_value("init")

    def status_now(self) -> dict:
        with self.status_lock:
            return dict(self.status)

    def finish(self, watch: TreeWatch) -> None:
        """Readers finish once every process holding a pipe end is dead; cgroup stragglers are
        killed until the cgroups are empty."""
        deadline = time.monotonic() + 5.0
        for t in self.threads:
            while t.is_alive() and time.monotonic() < deadline:
                watch.kill_tree()
                t.join(0.05)

    def _on_status(self, chunk: bytes) -> None:
        self._status_buf.extend(chunk)
        while b"\n" in self._status_buf:
            line, _, tail = bytes(self._status_buf).partition(b"\n")
            self._status_buf[:] = tail
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            with self.status_lock:
                for key, value in msg.items():
                    if key in ("isolation", "child_isolation"):
                        self.status.setdefault("isolation", []).extend(value)
                    else:
                        self.status[key] = value
            if "isolation" in msg:
                self.set_up.set()

    def _read_status(self) -> None:
        try:
            drain(self.pipes.status_r, self._on_status)
        finally:
            self.set_up.set()

    def _feed_payload(self) -> None:
        warm = self.warm
        if warm is not None:
            warm.wait()
            self.set_up.wait()  # moved earlier, the shim's own pinning to its first CPUs would fail
            try:
                placed = warm.cancelled or not warm.cpus or _record(self.moved, warm.move_cpus(warm.cpus))
            except Exception:  # noqa: BLE001  (the run must not be fed; the error is the verdict)
                placed = _record(self.moved, False)
            if warm.cancelled or not placed:
                os.close(self.pipes.in_w)  # never fed: the run is killed below
                return
        feed(self.pipes.in_w, warm.payload if warm is not None else self.payload)


def _await_end(proc: Any, watch: TreeWatch, warm: WarmStart | None, limits: SandboxLimits, io: _RunIO,
               t0: float) -> _Ended:
    """Wait for the shim (it exits right after the child and its namespace are gone), killing the
    tree at the wall-clock limit, which a warm run starts counting when it is given its payload."""
    pid = proc.pid
    waiter = ExitWaiter(pid)
    timed_out = False
    if warm is not None:
        while not warm.given and not waiter.wait(limits.poll_s):
            pass
        if not warm.given:  # it ended during its start-up: release the feeder
            warm.cancel()
        if warm.cancelled or (warm.given and warm.cpus and not _wait_for(io.moved, waiter)):
            watch.kill_tree()
        t0 = warm.given_at or time.monotonic()
    if not waiter.wait(limits.wall_s - (time.monotonic() - t0)):
        timed_out = True
        watch.kill_tree()
        if not waiter.wait(30.0):
            raise SandboxError(f"sandbox shim {pid} did not die after SIGKILL")
    wall_s = time.monotonic() - t0
    watch.stop_memory_watch()
    watch.kill_tree()  # leftovers (the shim is still a zombie here: pid not reusable)
    _, raw_status, rusage = os.wait4(pid, 0)
    watch.shim_reaped.set()
    proc.returncode = os.waitstatus_to_exitcode(raw_status)
    waiter.close()
    watch.join(5.0)
    return _Ended(timed_out, wall_s, rusage)


def _classify(argv: list[str], limits: SandboxLimits, io: _RunIO, ended: _Ended, shim_code: int | None,
              watch: TreeWatch, cgroup_oom: bool) -> SandboxOutcome:
    """What the child did, from the shim's status, its exit, its output and its resource use."""
    st = io.status_now()
    if "exec_error" in st:
        raise SandboxError(f"could not execute {argv[0]!r}: {st['exec_error']}")
    if "required_missing" in st:
        raise SandboxError(
            f"required isolation unavailable: {', '.join(st['required_missing'])} "
            f"(applied: {', '.join(st.get('isolation', []))})"
        )
    if "isolation" not in st and not (ended.timed_out or watch.out_of_memory.is_set()):
        raise SandboxError(f"sandbox shim failed (exit {shim_code}): {io.output.text()[-2000:]}")

    if "status" in st:  # the child's own wait status, relayed by the shim
        code = os.waitstatus_to_exitcode(st["status"])
    elif shim_code is not None and shim_code < 0:
        code = shim_code  # the shim itself was killed (by us, or in a fallback setup)
    else:
        code = None
    returncode = code if code is not None and code >= 0 else None
    signal_name = _signal_name(-code) if code is not None and code < 0 else None

    out_text = io.output.text()
    res_bytes = io.result.value()
    if io.result.overflow:
        out_text += f"\n[sandbox: result channel exceeded {limits.max_result_bytes} bytes; dropped]"
    cpu_time = ended.rusage.ru_utime + ended.rusage.ru_stime
    cpu_limited = not ended.timed_out and not watch.out_of_memory.is_set() and (
        signal_name == "SIGXCPU"
        or (signal_name == "SIGKILL" and cpu_time >= limits.cpu_limit_s - 0.5)
    )
    out_of_memory = watch.out_of_memory.is_set() or cgroup_oom
    if (
        not out_of_memory and not ended.timed_out and not cpu_limited and res_bytes is None
        and (signal_name is not None or returncode not in (0, None))
        and _OOM_TEXT.search(out_text)
    ):
        out_of_memory = True
    isolation = list(dict.fromkeys([*_PARENT_SIDE, *st.get("isolation", [])]))
    return SandboxOutcome(
        returncode=returncode,
        signal_name=signal_name,
        timed_out=ended.timed_out,
        out_of_memory=out_of_memory,
        cpu_limited=cpu_limited,
        output=out_text,
        result=res_bytes,
        wall_s=ended.wall_s,
        isolation=isolation,
        cpu_time_s=cpu_time,
        peak_memory_mb=round(watch.peak_mb, 1),
    )


CHECKOUT = Path(__file__).resolve().parents[2]  # env_pool/isolation/sandbox.py: the project's checkout
# The capabilities a run may keep (SandboxLimits.keep_capabilities), by number.
_CAPABILITIES = {"CAP_SYS_ADMIN": 21, "CAP_SYS_PTRACE": 19, "CAP_PERFMON": 38}


def _paths_to_keep(argv: list[str], env: dict[str, str]) -> list[str]:
    """What the child needs that the private /tmp would cover: a checkout, venv or include folder (CPATH) under /tmp."""
    wanted = [sys.prefix, sys.exec_prefix, sys.base_prefix, os.path.dirname(os.path.abspath(argv[0])),
              *env.get("PYTHONPATH", "").split(os.pathsep), *env.get("CPATH", "").split(os.pathsep), str(CHECKOUT)]
    return sorted({os.path.realpath(p) for p in wanted if p and os.path.isdir(p) and os.path.realpath(p).startswith("/tmp/")})


def _child_env(scratch: Path, limits: SandboxLimits, extra: dict[str, str] | None) -> dict[str, str]:
    names = _ENV_PASSTHROUGH + (_ENV_GPU_PASSTHROUGH if limits.use_gpu else ())
    env = {k: os.environ[k] for k in names if k in os.environ}
    env.setdefault("PATH", os.defpath)
    env.setdefault("LANG", "C.UTF-8")
    env.update(
        HOME=str(scratch),  # caches (torch extensions, triton) land in the workspace
        TMPDIR=str(scratch / "tmp"),
        PYTHONUNBUFFERED="1",  # output printed before a crash is not lost in a buffer
        PYTHONDONTWRITEBYTECODE="1",  # the source trees are read-only anyway
    )
    if not limits.use_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra or {})
    return env


def _rlimits(limits: SandboxLimits) -> list[list]:
    cpu = max(1, math.ceil(limits.cpu_limit_s))
    fsize = limits.max_file_mb << 20
    rl = [
        ["rlimit-cpu", "RLIMIT_CPU", cpu, cpu + 1],
        ["rlimit-core", "RLIMIT_CORE", 0, 0],  # no core dumps of multi-GiB processes into scratch
        ["rlimit-fsize", "RLIMIT_FSIZE", fsize, fsize],
        ["rlimit-nofile", "RLIMIT_NOFILE", limits.max_open_files, limits.max_open_files],
    ]
    as_mb = limits.address_space_limit_mb
    if as_mb is not None:
        rl.append(["rlimit-as", "RLIMIT_AS", as_mb << 20, as_mb << 20])
    return rl


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"SIG{num}"


def _record(box: list[bool], value: bool) -> bool:
    box.append(value)
    return value


def _wait_for(box: list[bool], waiter: ExitWaiter) -> bool:
    """The feeder's verdict on the CPU move (it comes within moments of ``give``)."""
    while not box and not waiter.wait(0.01):
        pass
    return box == [True]


_shim_source_cache: list[str] = []


def _shim_source() -> str:
    """The shim's text (env_pool/isolation/sandbox_shim.py), read once: it runs as ``python -I -S -c TEXT``."""
    if not _shim_source_cache:
        _shim_source_cache.append((Path(__file__).parent / "sandbox_shim.py").read_text())
    return _shim_source_cache[0]
