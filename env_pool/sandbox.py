"""Run one untrusted program in an isolated child process, and always get an outcome back.

The environment runs every candidate (the agent's kernels, the runner that imports them) through
``run_sandboxed``. The candidate is hostile: a crash, a hang, a memory bomb, a fork bomb, a
daemon that outlives its evaluation or a network call must cost one evaluation, never the worker.
Candidate misbehaviour is reported in a ``SandboxOutcome`` (``failure`` says which kind); only
the sandbox's own faults (the program cannot be started, a required protection is missing)
raise ``SandboxError``, which the caller maps to an ``infra`` failure.

How one run is put together (parent = the worker calling ``run_sandboxed``):

    parent ── shim (the shim section of this file: ``python -I -S -c SECTION CONFIG``)
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

Channels: stdin carries the payload (written from a thread, so a child that never reads
cannot block the parent); stdout and stderr share one pipe, read concurrently and trimmed to
head + tail; the result travels on a separate inherited pipe whose fd number is in
``CUDA_AGENT_RESULT_FD`` (the child side: ``child_result_channel()``). A runner must read
its payload and open the result channel *before* it runs untrusted code; the candidate runs
in the same process and could write there too, so whoever reads the result must validate it.

Every protection is applied where the machine allows and fails soft: what was applied is
listed in ``SandboxOutcome.isolation``, and a label is only listed when the protection is in
force (checked where it can be: "readonly-root" after statvfs says so).
``SandboxLimits.required_isolation`` turns chosen ones into hard requirements (the run is
refused, ``SandboxError``, when one is missing). Untrusted code requires at least
``UNTRUSTED_ISOLATION``.

The shim is the self-contained section at the end of this file (between the "shim" markers),
run under ``python -I -S -c``: no site-packages, only light standard modules (psutil is
imported where the parent needs it).
"""
from __future__ import annotations

import ctypes
import errno
import json
import math
import os
import re
import resource
import signal
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULT_FD_ENV = "CUDA_AGENT_RESULT_FD"

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
    # (env_pool/seccomp.py) refuses sched_setaffinity, so the candidate cannot widen them.
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


def child_result_channel():
    """Child side: the result channel as a writable binary file (close it to flush).

    Call it once, first thing, before running any untrusted code. The fd is made
    non-inheritable and the variable removed, so programs the child execs do not get it.
    """
    fd = int(os.environ.pop(RESULT_FD_ENV))
    os.set_inheritable(fd, False)
    return os.fdopen(fd, "wb")


def child_exit(channel, result: bytes) -> None:
    """Child side: write the result, flush everything, and exit at once (status 0).

    os._exit skips atexit handlers and finalizers: nothing untrusted code registered runs
    after the result is written.
    """
    channel.write(result)
    channel.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# --------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------


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
    protocol, env_pool/rounds.py); the caller keeps and closes its own copies. A ``WarmStart``
    as the payload starts the run now and feeds it later, and tells its processes (see WarmStart:
    the harness's code sampler, env_pool/code_sampler.py, attributes their samples).
    """
    import subprocess

    import psutil

    warm = payload if isinstance(payload, WarmStart) else None
    if not argv:
        raise ValueError("argv must not be empty")
    scratch = Path(scratch).resolve()
    (scratch / "tmp").mkdir(parents=True, exist_ok=True)
    hidden = [str(Path(p).absolute()) for p in [*limits.hidden_paths, *(hidden_paths or [])]]

    cgroups = _Cgroups.create(limits)
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    res_r, res_w = os.pipe()
    st_r, st_w = os.pipe()
    child_env = _child_env(scratch, limits, env) if inherit_env else dict(env or {})
    child_env[RESULT_FD_ENV] = str(res_w)
    visible = [os.path.abspath(p) for p in limits.visible_paths]
    config = {
        "argv": list(argv),
        "scratch": str(scratch),
        "hidden": hidden,
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
        "result_fd": res_w,
        "status_fd": st_w,
        "parent_pid": os.getpid(),
    }
    shim_argv = [sys.executable, "-I", "-S", "-c", _shim_source(), json.dumps(config)]
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            shim_argv, stdin=in_r, stdout=out_w, stderr=out_w, cwd=str(scratch), env=child_env,
            pass_fds=(res_w, st_w, *pass_fds), start_new_session=True, close_fds=True,
        )
    except OSError as exc:
        for fd in (in_w, out_r, res_r, st_r):
            os.close(fd)
        cgroups.remove()
        raise SandboxError(f"could not start the sandbox shim: {exc}") from exc
    finally:
        for fd in (in_r, out_w, res_w, st_w):
            os.close(fd)
    pid = proc.pid  # also the process group id (start_new_session)

    # ---- Killing: everything we know of, by every handle we have. Safe to call repeatedly.
    tracked: dict[int, psutil.Process] = {}
    shim_reaped = threading.Event()
    kill_lock = threading.Lock()

    def kill_tree() -> None:
        with kill_lock:
            cgroups.kill()
            if not shim_reaped.is_set():
                # While the shim is unreaped its pid, and so the group id, cannot be reused.
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            for p in list(tracked.values()):
                try:
                    p.kill()  # psutil checks the creation time: a reused pid is not signalled
                except psutil.Error:
                    pass

    try:
        # ---- I/O threads: payload in, output and result out, shim status messages.
        output = _HeadTail(limits.max_output_chars)
        result = _Bounded(limits.max_result_bytes)
        status: dict = {}
        status_lock = threading.Lock()

        status_buf = bytearray()

        def on_status(chunk: bytes) -> None:
            status_buf.extend(chunk)
            while b"\n" in status_buf:
                line, _, tail = bytes(status_buf).partition(b"\n")
                status_buf[:] = tail
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                with status_lock:
                    for key, value in msg.items():
                        if key in ("isolation", "child_isolation"):
                            status.setdefault("isolation", []).extend(value)
                        else:
                            status[key] = value
                if "isolation" in msg:
                    set_up.set()

        moved: list[bool] = []
        set_up = threading.Event()  # the shim has built the sandbox (or is gone): its CPUs may move now

        def status_reader() -> None:
            try:
                _drain(st_r, on_status)
            finally:
                set_up.set()

        def feed() -> None:
            if warm is not None:
                warm.wait()
                set_up.wait()  # moved earlier, the shim's own pinning to its first CPUs would fail
                try:
                    placed = warm.cancelled or not warm.cpus or _record(moved, warm.move_cpus(warm.cpus))
                except Exception:  # noqa: BLE001  (the run must not be fed; the error is the verdict)
                    placed = _record(moved, False)
                if warm.cancelled or not placed:
                    os.close(in_w)  # never fed: the run is killed below
                    return
            _feed(in_w, warm.payload if warm is not None else payload)

        # ---- Watchdog: tree membership and resident memory, every poll_s.
        oom = threading.Event()
        stop = threading.Event()
        peak = [0.0]
        limit_bytes = limits.memory_mb << 20

        def members() -> set[int]:
            # The process tree (complete under a PID namespace: orphans stay below its init),
            # plus the cgroups' members (complete without one, whatever a process reparented to).
            try:
                pids = {c.pid for c in psutil.Process(pid).children(recursive=True)}
            except psutil.Error:
                pids = set()
            pids.update(cgroups.pids() or ())
            return pids

        def move_cpus(cpus: tuple[int, ...]) -> bool:
            cgroups.set_cpus(cpus)  # first: a thread's affinity cannot leave its cpuset
            return _move_threads(members() | {pid}, set(cpus))

        if warm is not None:
            warm.members = lambda: members() | {pid}
            warm.move_cpus = move_cpus

        threads = [
            threading.Thread(target=feed, daemon=True),
            threading.Thread(target=_drain, args=(out_r, output.add), daemon=True),
            threading.Thread(target=_drain, args=(res_r, result.add), daemon=True),
            threading.Thread(target=status_reader, daemon=True),
        ]
        for t in threads:
            t.start()

        def watchdog() -> None:
            while not stop.is_set():
                if warm is not None and not warm.given:  # trusted start-up: nothing to watch yet
                    stop.wait(limits.poll_s)
                    continue
                with status_lock:
                    ours = {pid, status.get("init")}
                rss = 0
                for p_id in members():
                    p = tracked.get(p_id)
                    if p is None:
                        try:
                            p = tracked[p_id] = psutil.Process(p_id)
                        except psutil.Error:
                            continue
                    if p_id in ours:
                        continue
                    try:
                        rss += p.memory_info().rss
                    except psutil.Error:
                        pass
                peak[0] = max(peak[0], rss / 2**20)
                if rss > limit_bytes:
                    oom.set()
                    kill_tree()
                    return
                stop.wait(limits.poll_s)

        dog = threading.Thread(target=watchdog, daemon=True)
        dog.start()

        # ---- Wait for the shim (it exits right after the child and its namespace are gone).
        waiter = _ExitWaiter(pid)
        timed_out = False
        if warm is not None:  # the wall clock starts when the payload is given
            while not warm.given and not waiter.wait(limits.poll_s):
                pass
            if not warm.given:  # it ended during its start-up: release the feeder
                warm.cancel()
            if warm.cancelled or (warm.given and warm.cpus and not _wait_for(moved, waiter)):
                kill_tree()
            t0 = warm.given_at or time.monotonic()
        if not waiter.wait(limits.wall_s - (time.monotonic() - t0)):
            timed_out = True
            kill_tree()
            if not waiter.wait(30.0):
                raise SandboxError(f"sandbox shim {pid} did not die after SIGKILL")
        wall_s = time.monotonic() - t0
        stop.set()
        kill_tree()  # leftovers (the shim is still a zombie here: pid not reusable)
        _, raw_status, rusage = os.wait4(pid, 0)
        shim_reaped.set()
        proc.returncode = os.waitstatus_to_exitcode(raw_status)
        waiter.close()
        dog.join(5.0)

        # Readers finish once every process holding a pipe end is dead; cgroup stragglers are
        # killed until the cgroups are empty.
        deadline = time.monotonic() + 5.0
        for t in threads:
            while t.is_alive() and time.monotonic() < deadline:
                kill_tree()
                t.join(0.05)
        cgroup_oom = cgroups.oom_killed()
        cgroups.remove()
    except BaseException:
        # Our own failure (or Ctrl-C) mid-run: the child's tree must not outlive it either.
        kill_tree()
        if not shim_reaped.is_set():
            try:
                os.waitpid(pid, os.WNOHANG)  # never block here: it may be stuck in the kernel
            except ChildProcessError:
                pass
        cgroups.remove()
        raise

    # ---- Classify.
    if warm is not None and warm.given and not warm.cancelled and warm.cpus and moved != [True]:
        raise SandboxError(f"could not move the run to CPUs {list(warm.cpus)}: a thread stayed elsewhere")
    with status_lock:
        st = dict(status)
    if "exec_error" in st:
        raise SandboxError(f"could not execute {argv[0]!r}: {st['exec_error']}")
    if "required_missing" in st:
        raise SandboxError(
            f"required isolation unavailable: {', '.join(st['required_missing'])} "
            f"(applied: {', '.join(st.get('isolation', []))})"
        )
    if "isolation" not in st and not (timed_out or oom.is_set()):
        raise SandboxError(f"sandbox shim failed (exit {proc.returncode}): {output.text()[-2000:]}")

    if "status" in st:  # the child's own wait status, relayed by the shim
        code = os.waitstatus_to_exitcode(st["status"])
    elif proc.returncode is not None and proc.returncode < 0:
        code = proc.returncode  # the shim itself was killed (by us, or in a fallback setup)
    else:
        code = None
    returncode = code if code is not None and code >= 0 else None
    signal_name = _signal_name(-code) if code is not None and code < 0 else None

    out_text = output.text()
    res_bytes = result.value()
    if result.overflow:
        out_text += f"\n[sandbox: result channel exceeded {limits.max_result_bytes} bytes; dropped]"
    cpu_time = rusage.ru_utime + rusage.ru_stime
    cpu_limited = not timed_out and not oom.is_set() and (
        signal_name == "SIGXCPU"
        or (signal_name == "SIGKILL" and cpu_time >= limits.cpu_limit_s - 0.5)
    )
    out_of_memory = oom.is_set() or cgroup_oom
    if (
        not out_of_memory and not timed_out and not cpu_limited and res_bytes is None
        and (signal_name is not None or returncode not in (0, None))
        and _OOM_TEXT.search(out_text)
    ):
        out_of_memory = True
    isolation = list(dict.fromkeys([*_PARENT_SIDE, *st.get("isolation", [])]))
    return SandboxOutcome(
        returncode=returncode,
        signal_name=signal_name,
        timed_out=timed_out,
        out_of_memory=out_of_memory,
        cpu_limited=cpu_limited,
        output=out_text,
        result=res_bytes,
        wall_s=wall_s,
        isolation=isolation,
        cpu_time_s=cpu_time,
        peak_memory_mb=round(peak[0], 1),
    )


# The capabilities a run may keep (SandboxLimits.keep_capabilities), by number.
_CAPABILITIES = {"CAP_SYS_ADMIN": 21, "CAP_SYS_PTRACE": 19, "CAP_PERFMON": 38}


def _paths_to_keep(argv: list[str], env: dict[str, str]) -> list[str]:
    """What the child needs that the private /tmp would cover: a checkout, venv or include folder (CPATH) under /tmp."""
    wanted = [sys.prefix, sys.exec_prefix, sys.base_prefix, os.path.dirname(os.path.abspath(argv[0])),
              *env.get("PYTHONPATH", "").split(os.pathsep), *env.get("CPATH", "").split(os.pathsep), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
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


def _wait_for(box: list[bool], waiter: "_ExitWaiter") -> bool:
    """The feeder's verdict on the CPU move (it comes within moments of ``give``)."""
    while not box and not waiter.wait(0.01):
        pass
    return box == [True]


def _move_threads(pids: set[int], cpus: set[int]) -> bool:
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


def _feed(fd: int, payload: bytes) -> None:
    """Write the payload to the child's stdin; a child that never reads only costs EPIPE."""
    try:
        view = memoryview(payload)
        while view:
            n = os.write(fd, view[: 1 << 20])
            view = view[n:]
    except OSError:
        pass
    finally:
        os.close(fd)


def _drain(fd: int, sink) -> None:
    try:
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return
            sink(chunk)
    except OSError:
        pass
    finally:
        os.close(fd)


class _HeadTail:
    """Bounded output: the first and last limit/2 bytes, and how many were cut in between."""

    def __init__(self, limit: int) -> None:
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            if len(chunk) >= self.tail_limit:
                self.tail[:] = chunk[len(chunk) - self.tail_limit:]
            else:
                self.tail += chunk
                excess = len(self.tail) - self.tail_limit
                if excess > 0:
                    del self.tail[:excess]

    def text(self) -> str:
        cut = self.total - len(self.head) - len(self.tail)
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        if cut > 0:
            return f"{head}\n[... {cut} bytes of output cut ...]\n{tail}"
        return head + tail


class _Bounded:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[bytes] = []
        self.size = 0
        self.overflow = False

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            self.overflow = True
            self.chunks.clear()  # keep draining so the writer is never blocked; store nothing
        elif not self.overflow:
            self.chunks.append(chunk)

    def value(self) -> bytes | None:
        if self.overflow or self.size == 0:
            return None
        return b"".join(self.chunks)


class _ExitWaiter:
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


class _Cgroups:
    """Fresh cgroups for one run, where the machine lets us create them (all soft).

    pids: a hard cap on processes + threads (the only fork-bomb limit that binds root).
    memory: a hard backstop above memory_mb (the kernel's OOM killer acts between two watchdog
    polls, and tmpfs pages, which are not RSS, are charged too).
    cpuset: SandboxLimits.cpus, enforced by the kernel whatever the run does to its affinity.
    cgroup v2 without controllers still gives ``cgroup.kill``: kill every member at once,
    whatever sessions or process groups they moved to. Membership also drives the watchdog.
    """

    _counter = 0

    def __init__(self) -> None:
        self.dirs: list[tuple[Path, str]] = []  # (cgroup dir, isolation label)

    @classmethod
    def create(cls, limits: SandboxLimits) -> "_Cgroups":
        self = cls()
        cls._counter += 1
        name = f"cuda-agent-sandbox-{os.getpid()}-{cls._counter}-{time.monotonic_ns() % 10**9}"
        try:
            v1, v2 = _cgroup_mounts()
            own = _own_cgroups()
        except OSError:
            return self
        mem_bytes = (limits.memory_mb + 1024) << 20
        skip = set(limits.skip_isolation)
        cpus = ",".join(str(c) for c in sorted(set(limits.cpus)))
        for ctrl in ("pids", "memory", "cpuset"):
            if ctrl == "cpuset" and not cpus:
                continue
            if ctrl in v1 and ctrl in own and f"cgroup-{ctrl}" not in skip:
                d = v1[ctrl] / own[ctrl].lstrip("/") / name
                try:
                    d.mkdir()
                except OSError:
                    continue
                try:
                    if ctrl == "pids":
                        (d / "pids.max").write_text(str(limits.max_pids))
                    elif ctrl == "cpuset":
                        # A v1 cpuset starts empty: it needs its memory nodes before any member.
                        (d / "cpuset.mems").write_text((d.parent / "cpuset.mems").read_text())
                        (d / "cpuset.cpus").write_text(cpus)
                    else:
                        (d / "memory.limit_in_bytes").write_text(str(mem_bytes))
                        if (d / "memory.memsw.limit_in_bytes").exists():
                            (d / "memory.memsw.limit_in_bytes").write_text(str(mem_bytes))
                    self.dirs.append((d, f"cgroup-{ctrl}"))
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
                if "pids" in controllers and not self.has("cgroup-pids") and "cgroup-pids" not in skip:
                    (d / "pids.max").write_text(str(limits.max_pids))
                    labels.append("cgroup-pids")
                if "memory" in controllers and not self.has("cgroup-memory") and "cgroup-memory" not in skip:
                    (d / "memory.max").write_text(str(mem_bytes))
                    if (d / "memory.swap.max").exists():
                        (d / "memory.swap.max").write_text("0")
                    labels.append("cgroup-memory")
                if cpus and "cpuset" in controllers and not self.has("cgroup-cpuset") and "cgroup-cpuset" not in skip:
                    (d / "cpuset.cpus").write_text(cpus)
                    labels.append("cgroup-cpuset")
            except OSError:
                pass
            if (d / "cgroup.kill").exists() and "cgroup-kill" not in skip:
                labels.append("cgroup-kill")
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
                    if opt in ("pids", "memory", "cpuset"):
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


# ==== shim: begin ===========================================================================
# Everything from here to the end marker also runs on its own, as the shim:
# `python -I -S -c <this section> CONFIG`. It must stay self-contained and import only a few
# light standard modules: its start-up is paid on every evaluation (the parent section's
# imports, dataclasses and pathlib above all, would double the cost of a `python -c pass`).
import ctypes  # noqa: E402
import errno  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import signal  # noqa: E402
import stat  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
MNT_DETACH = 2
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
SYS_MOUNT_SETATTR = 442  # same number on x86_64 and aarch64 (unified syscall table)
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}  # glibc has no wrapper for it
PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


_SKIP: set[str] = set()  # SandboxLimits.skip_isolation, in the shim


def _on(name: str) -> bool:
    return name not in _SKIP


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


class _Libc:
    """The few libc calls Python 3.11 lacks (unshare, mount, umount2, prctl, capset, syscall)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.unshare_ = libc.unshare
        self.unshare_.argtypes = [ctypes.c_int]
        self.mount_ = libc.mount
        self.mount_.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        self.umount2_ = libc.umount2
        self.umount2_.argtypes = [ctypes.c_char_p, ctypes.c_int]
        self.prctl_ = libc.prctl
        self.prctl_.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        self.capset_ = libc.capset
        self.syscall_ = libc.syscall

    @staticmethod
    def _check(ret: int, what: str) -> None:
        if ret != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def unshare(self, flags: int) -> bool:
        return self.unshare_(flags) == 0

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
        enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
        self._check(self.mount_(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")

    def umount(self, target: str) -> None:
        self._check(self.umount2_(os.fsencode(target), MNT_DETACH), f"umount {target}")

    def prctl(self, option: int, arg: int = 0, arg3: int = 0) -> bool:
        return self.prctl_(option, arg, arg3, 0, 0) == 0

    def mount_setattr(self, path: str, set_: int, clr: int, recursive: bool = True) -> None:
        attr = _MountAttr(set_, clr, 0, 0)
        ret = self.syscall_(
            ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD), ctypes.c_char_p(os.fsencode(path)),
            ctypes.c_uint(AT_RECURSIVE if recursive else 0), ctypes.byref(attr),
            ctypes.c_size_t(ctypes.sizeof(attr)),
        )
        self._check(ret, f"mount_setattr {path}")

    def pivot_root(self, new_root: str, put_old: str) -> None:
        nr = SYS_PIVOT_ROOT.get(os.uname().machine)
        if nr is None:
            raise OSError(errno.ENOSYS, f"pivot_root: unknown syscall number on {os.uname().machine}")
        ret = self.syscall_(ctypes.c_long(nr), ctypes.c_char_p(os.fsencode(new_root)),
                            ctypes.c_char_p(os.fsencode(put_old)))
        self._check(ret, "pivot_root")

    def drop_all_caps(self, keep: list[int] = ()) -> None:
        """Empty the bounding, ambient, effective, permitted and inheritable sets (except ``keep``).

        The child stays uid 0 (the interpreter lives in /root, mode 0700) but without any
        capability it cannot undo the sandbox: no umount/mount (hidden paths stay hidden, the
        read-only root stays read-only), no writing to cgroups, no ptrace or /proc/PID/root of
        privileged processes, no raw I/O, no module loading. The empty bounding set keeps exec
        from granting root its capabilities back.
        """
        try:
            last = int(open("/proc/sys/kernel/cap_last_cap").read())
        except (OSError, ValueError):
            last = 63
        for cap in range(last + 1):
            if cap in keep:
                continue
            if not self.prctl(PR_CAPBSET_DROP, cap) and ctypes.get_errno() != errno.EINVAL:
                self._check(-1, f"drop capability {cap} from the bounding set")
        self.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
        hdr = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
        data = (_CapData * 2)()
        for cap in keep:  # kept in effective, permitted and inheritable: exec as root keeps them
            word, bit = divmod(cap, 32)
            data[word].effective |= 1 << bit
            data[word].permitted |= 1 << bit
            data[word].inheritable |= 1 << bit
        self._check(self.capset_(ctypes.byref(hdr), ctypes.byref(data)), "capset")


def _shim_main(raw_config: str) -> None:
    cfg = json.loads(raw_config)
    status_fd = cfg["status_fd"]

    def report(**msg) -> None:  # one short line per write: atomic on a pipe (< PIPE_BUF)
        os.write(status_fd, (json.dumps(msg) + "\n").encode())

    iso: list[str] = []
    libc = _Libc()
    _SKIP.update(cfg["skip"])
    # Join the run's cgroups first, so every process forked from here on is counted and capped.
    for procs_file, label in cfg["cgroups"]:
        try:
            with open(procs_file, "w") as f:
                f.write(str(os.getpid()))
            iso.extend(label.split(","))
        except OSError:
            pass
    # CPUs: set on the shim, before anything is forked, so init, the child and every thread
    # the child starts inherit them (the cpuset cgroup joined above enforces them too).
    if cfg.get("cpus") and _on("cpu-affinity") and _set_affinity(cfg["cpus"]):
        iso.append("cpu-affinity")
    # If the worker dies, the shim dies (and with it init, and with init the whole namespace).
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL):
        if os.getppid() != cfg["parent_pid"]:
            os._exit(125)
        iso.append("pdeathsig")
    # Make the kernel's OOM killer pick the candidate before the worker (the child cannot lower
    # it again without CAP_SYS_RESOURCE).
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
        iso.append("oom-score")
    except OSError:
        pass
    # Orphans (double fork) reparent to the shim instead of the machine's init, so they stay
    # in the tree that is killed. Superseded by the PID namespace where that works.
    if _on("subreaper") and libc.prctl(PR_SET_CHILD_SUBREAPER, 1):
        iso.append("subreaper")
    # No network: a new network namespace has only a loopback device, and it is down.
    if not cfg["allow_network"] and _on("netns") and libc.unshare(CLONE_NEWNET):
        iso.append("netns")
        if cfg.get("loopback") and _loopback_up():
            iso.append("loopback")
    # SysV IPC and POSIX message queues private to the run (no talking to host processes).
    if _on("ipcns") and libc.unshare(CLONE_NEWIPC):
        iso.append("ipcns")
    # The filesystem view: see _setup_mounts.
    if _on("mountns") and libc.unshare(CLONE_NEWNS):
        iso.append("mountns")
        iso.extend(_setup_mounts(libc, cfg))
    # Our cwd still points into the original (now read-only) mount: enter the writable one.
    os.chdir(cfg["scratch"])
    # PID namespace: the child sees only its own processes (not the worker's, whose
    # environment and command lines may hold secrets, and none it could signal); killing its
    # init kills every process in it, however it daemonised. unshare(CLONE_NEWPID) applies to
    # the children forked after it; the first one becomes PID 1.
    init_pid = None
    if _on("pidns") and libc.unshare(CLONE_NEWPID):
        try:
            init_pid = os.fork()
        except OSError:
            init_pid = None
        if init_pid == 0:
            _init_main(libc)
        if init_pid is not None:
            iso.append("pidns")
    os.set_inheritable(status_fd, False)  # the child reports once more, then exec closes it
    report(isolation=iso, init=init_pid)
    child = os.fork()
    if child == 0:
        _child_main(libc, cfg, iso, init_pid is not None and "mountns" in iso, status_fd)
    # The child has the payload pipe and the result channel; the shim must not hold them open.
    os.close(cfg["result_fd"])
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    status = None
    while True:
        try:
            pid, st = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == child:
            status = st
            break
    _teardown(init_pid)
    if status is not None:
        report(status=status)
    code = os.waitstatus_to_exitcode(status) if status is not None else -signal.SIGKILL
    os._exit(code if code >= 0 else 128 - code)


def _set_affinity(cpus: list[int]) -> bool:
    """Pin this process to ``cpus``; True only when its affinity is now exactly that set."""
    try:
        os.sched_setaffinity(0, cpus)
        return os.sched_getaffinity(0) == set(cpus)
    except (OSError, ValueError):
        return False


def _loopback_up() -> bool:
    """Set IFF_UP on the new namespace's lo (SIOCGIFFLAGS / SIOCSIFFLAGS on a throwaway socket)."""
    import fcntl
    import socket
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            req = struct.pack("16sh14x", b"lo", 0)
            flags = struct.unpack("16sh14x", fcntl.ioctl(sock, 0x8913, req))[1]  # SIOCGIFFLAGS
            fcntl.ioctl(sock, 0x8914, struct.pack("16sh14x", b"lo", flags | 0x1))  # SIOCSIFFLAGS, IFF_UP
        return True
    except OSError:
        return False


def _init_main(libc: _Libc) -> None:
    """PID 1 of the run's namespace: reap orphans until the shim SIGKILLs it.

    A separate init keeps the candidate from being PID 1 (which the kernel shields from its
    own signals: os.kill(os.getpid(), SIGSEGV) or abort() would not end it).
    """
    try:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        os.closerange(0, 1 << 16)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        while True:
            try:
                while os.waitpid(-1, os.WNOHANG)[0] != 0:
                    pass
            except ChildProcessError:
                pass
            signal.sigwait({signal.SIGCHLD})
    finally:
        os._exit(0)


def _child_main(libc: _Libc, cfg: dict, iso: list[str], new_proc: bool, status_fd: int) -> None:
    """The candidate's process before exec: /proc, rlimits, capabilities, then exec."""

    def report(**msg) -> None:
        os.write(status_fd, (json.dumps(msg) + "\n").encode())

    try:
        mine: list[str] = []
        if new_proc and _on("procfs"):
            # A /proc of the new PID namespace: only the run's processes. Writable (libcuda
            # fails with error 304 on a read-only /proc), with its global knobs read-only.
            try:
                libc.mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
                if _protect_proc(libc):
                    mine.append("procfs")
                else:
                    libc.umount("/proc")  # back to the host's, read-only, /proc
            except OSError:
                pass
        for label, name, soft, hard in cfg["rlimits"]:
            if not _on(label):
                continue
            try:
                resource.setrlimit(getattr(resource, name), (soft, hard))
                mine.append(label)
            except (OSError, ValueError):
                pass
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the shim's death ends it (no PID namespace)
        if _on("no-caps"):
            try:
                libc.drop_all_caps(cfg.get("keep_caps", []))
                mine.append("some-caps-kept" if cfg.get("keep_caps") else "no-caps")
            except OSError:
                pass
        if _on("no-new-privs") and libc.prctl(PR_SET_NO_NEW_PRIVS, 1):
            mine.append("no-new-privs")
        # Python ignores SIGPIPE and SIGXFSZ; ignored signals survive exec: restore defaults.
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        have = set(iso) | set(mine) | set(cfg["parent_side"])
        missing = [r for r in cfg["required"] if r not in have]
        if missing:
            report(required_missing=missing)
            os._exit(125)
        report(child_isolation=mine)
        _exec(cfg["argv"], dict(os.environ))
    except BaseException as exc:  # noqa: BLE001 - anything here is the sandbox's failure
        try:
            report(exec_error=f"{type(exc).__name__}: {exc}")
        finally:
            os._exit(127)


def _exec(argv: list[str], env: dict[str, str]) -> None:
    """os.execvpe, less its lazy ``import warnings``: past pivot_root the stdlib is out of view."""
    if "/" in argv[0]:
        os.execve(argv[0], argv, env)
    first_error: OSError | None = None
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        try:
            os.execve(os.path.join(directory or ".", argv[0]), argv, env)
        except (FileNotFoundError, NotADirectoryError):
            pass
        except OSError as exc:  # found, but not executable: say so rather than "not found"
            first_error = first_error or exc
    raise first_error or FileNotFoundError(errno.ENOENT, f"{argv[0]} not found on PATH")


def _setup_mounts(libc: _Libc, cfg: dict) -> list[str]:
    """Build the child's filesystem view inside its new mount namespace (fails soft).

    - Everything is made private first, so nothing done here propagates back to the host.
    - Visible paths (SandboxLimits.visible_paths): first a fresh root that holds only those
      (_enter_visible_root); the steps below then build /tmp, /dev and scratch inside it.
    - /tmp: a fresh size-limited tmpfs. The shared /tmp holds other runs' files and sockets of
      host services (Ray's plasma store, ...); a candidate must neither read nor leave anything.
      A checkout or venv that lives under /tmp (_paths_to_keep) is bound back into it.
    - /dev: a fresh tmpfs holding only null, zero, full, random, urandom (plus /dev/nvidia* for
      GPU runs) and a private /dev/shm tmpfs. A read-only mount does not stop writes to device
      nodes, and uid 0 may open /dev/vda: the host's /dev must not be visible at all.
    - scratch: bind-mounted onto itself (or, when it lives under the new /tmp, re-bound from a
      descriptor opened beforehand), so it can stay writable.
    - Then every mount is made read-only recursively (mount_setattr AT_RECURSIVE, or one
      remount per mount on older kernels), and write access is given back to the scratch, /tmp
      and /dev/shm mounts themselves only, never to what is mounted below them: the checkout
      or venv bound back under /tmp stays read-only. "readonly-root" is reported only once
      statvfs shows / and every bound-back and visible path read-only.
    - /proc stays writable (libcuda fails with error 304 on a read-only one), its machine-wide
      parts bound read-only (_protect_proc); with a PID namespace the child mounts its own.
    - Hidden paths: an empty read-only tmpfs over each directory, /dev/null over each file;
      "hidden-paths" only when there were some and every one of them is hidden.
    """
    iso: list[str] = []
    try:
        libc.mount(None, "/", None, MS_REC | MS_PRIVATE)
    except OSError:
        return iso  # mounts would leak to the host: change nothing
    scratch = cfg["scratch"]
    scratch_fd = os.open(scratch, os.O_PATH | os.O_DIRECTORY)
    writable: list[str] = []
    visible = cfg.get("visible") or []
    fresh_root = bool(visible) and _on("visible-only") and _enter_visible_root(libc, visible)

    tmp_opts = f"size={int(cfg['tmp_mb'])}m,mode=1777"
    if _on("private-tmp"):
        keep = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in cfg.get("keep", []) if os.path.isdir(p)}
        try:
            libc.mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, tmp_opts)
            iso.append("private-tmp")
            writable.append("/tmp")
            for path, fd in keep.items():  # Python, the venv or the sources living under /tmp: bound back
                os.makedirs(path, exist_ok=True)
                libc.mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        except OSError:
            pass
        finally:
            for fd in keep.values():
                os.close(fd)

    if _on("private-dev") and _private_dev(libc, cfg["use_gpu"], tmp_opts):
        iso.append("private-dev")
    if _on("private-shm") and _private_shm(libc, tmp_opts):
        iso.append("private-shm")
        writable.append("/dev/shm")

    scratch_ok = False
    try:
        try:
            same = os.path.samestat(os.stat(scratch), os.fstat(scratch_fd))
        except OSError:
            same = False
        if same:
            libc.mount(scratch, scratch, None, MS_BIND | MS_REC)
        else:  # covered by the new /tmp (or /dev, or a fresh root): recreate the path, bind the original there
            os.makedirs(scratch, exist_ok=True)
            libc.mount(f"/proc/self/fd/{scratch_fd}", scratch, None, MS_BIND | MS_REC)
        scratch_ok = True
        writable.append(scratch)
    except OSError:
        pass
    finally:
        os.close(scratch_fd)
    if fresh_root:
        # The scratch dir is bound from the old root: only now can that be let go of. Should
        # this fail, the shim ends here and the run is refused: the old root must not stay.
        libc.umount(_OLD_ROOT)
        os.rmdir(_OLD_ROOT)
        iso.append("visible-only")

    must_be_readonly = ["/", *cfg.get("keep", []), *visible]
    if scratch_ok and _on("readonly-root") and _readonly_except(libc, writable, must_be_readonly):
        iso.append("readonly-root")
        # /proc writable again, its global knobs excepted (see _protect_proc): libcuda needs it.
        # Where that cannot be done, it stays read-only (CUDA then fails: a safe failure).
        if _protect_proc(libc):
            try:
                libc.mount_setattr("/proc", 0, MOUNT_ATTR_RDONLY, recursive=False)
            except OSError:
                try:
                    libc.mount(None, "/proc", None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | MS_NOEXEC)
                except OSError:
                    pass

    hidden = cfg["hidden"] if _on("hidden-paths") else []
    hidden_ok = True
    for path in hidden:
        try:
            st = os.stat(path)
        except OSError:
            continue  # not visible from here (absent, or under the private /tmp): hidden already
        try:
            if stat.S_ISDIR(st.st_mode):
                libc.mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=555")
            else:
                libc.mount("/dev/null", path, None, MS_BIND)
                libc.mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
        except OSError:
            hidden_ok = False
    if hidden and hidden_ok:
        iso.append("hidden-paths")
    return iso


def _enter_visible_root(libc: _Libc, paths: list[str]) -> bool:
    """Make a tmpfs that holds only ``paths`` the root of this mount namespace (pivot_root).

    Each path is bound (recursively) at its real location, and every symlink met on the way
    there is recreated as it is on the host (/lib64 -> usr/lib64, /usr/local/cuda ->
    cuda-13.0 when /usr is not bound whole), so programs and the loader find their files under
    the names they know. The tmpfs is staged over /tmp: whatever the later steps need from
    the old root is held open by descriptor before that (the scratch dir by _setup_mounts, the
    visible paths here). The host's /dev and /proc are bound in only for the steps that
    follow: the private /dev then covers the first, the run's own procfs the second (without
    a PID namespace the host's /proc stays, as in the normal view). The old root waits at
    _OLD_ROOT (a bind source must be a mount of this namespace) until _setup_mounts has bound
    the scratch dir, then it is detached: nothing else of the host is reachable by any path.
    """
    binds, links = _visible_plan(paths)
    fds: dict[str, int] = {}
    stage = "/tmp"
    staged = False
    try:
        for path in binds:
            fds[path] = os.open(path, os.O_PATH)
        libc.mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=755")
        staged = True
        for path, fd in fds.items():
            _make_mountpoint(stage + path, stat.S_ISDIR(os.fstat(fd).st_mode))
            libc.mount(f"/proc/self/fd/{fd}", stage + path, None, MS_BIND | MS_REC)
        for link, dest in links:
            os.makedirs(os.path.dirname(stage + link), exist_ok=True)
            os.symlink(dest, stage + link)
        for name, mode in (("tmp", 0o1777), ("dev", 0o755), ("proc", 0o555)):
            _make_mountpoint(f"{stage}/{name}", True)
            os.chmod(f"{stage}/{name}", mode)
        libc.mount("/dev", f"{stage}/dev", None, MS_BIND | MS_REC)
        libc.mount("/proc", f"{stage}/proc", None, MS_BIND | MS_REC)
        os.mkdir(stage + _OLD_ROOT, 0o700)
        libc.pivot_root(stage, stage + _OLD_ROOT)
        os.chdir("/")
        return True
    except OSError:
        if staged:
            try:
                libc.umount(stage)
            except OSError:
                pass
        return False
    finally:
        for fd in fds.values():
            os.close(fd)


_OLD_ROOT = "/.old-root"  # where pivot_root puts the host's root until it is detached


def _make_mountpoint(path: str, is_dir: bool) -> None:
    if is_dir:
        os.makedirs(path, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


def _visible_plan(paths: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """(real paths to bind, none inside another; (link, target) pairs to recreate)."""
    real: set[str] = set()
    links: dict[str, str] = {}
    for path in paths:
        resolved = _follow_links(os.path.normpath(path), links)
        if resolved is not None and os.path.exists(resolved):
            real.add(resolved)
    inside = lambda p, roots: any(p != r and p.startswith(r.rstrip("/") + "/") for r in roots)  # noqa: E731
    binds = sorted(p for p in real if not inside(p, real))
    # A link inside a bound tree is there already (and that tree is read-only).
    return binds, sorted((link, dest) for link, dest in links.items() if not inside(link, binds))


def _follow_links(path: str, links: dict[str, str]) -> str | None:
    """``path`` with every symlink on the way resolved (each one met goes into ``links``); None on a loop."""
    for _ in range(40):
        parts = [p for p in path.split("/") if p]
        here = ""
        for i, part in enumerate(parts):
            step = f"{here}/{part}"
            if os.path.islink(step):
                dest = os.readlink(step)
                links[step] = dest
                base = dest if dest.startswith("/") else os.path.join(here or "/", dest)
                path = os.path.normpath(os.path.join(base, *parts[i + 1:]))
                break
            here = step
        else:
            return here or "/"
    return None


def _private_dev(libc: _Libc, use_gpu: bool, shm_opts: str) -> bool:
    names = ["null", "zero", "full", "random", "urandom"]
    if use_gpu:
        try:
            names += sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))
        except OSError:
            pass
    fds: dict[str, int] = {}
    for n in names:
        try:
            fds[n] = os.open(f"/dev/{n}", os.O_PATH)
        except OSError:
            pass
    try:
        try:
            libc.mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=1m,mode=755")
        except OSError:
            return False
        try:
            for n, fd in fds.items():
                target = f"/dev/{n}"
                if stat.S_ISDIR(os.fstat(fd).st_mode):
                    os.mkdir(target)
                else:
                    os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
                libc.mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
            for link, dest in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                               ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
                os.symlink(dest, f"/dev/{link}")
            os.mkdir("/dev/shm", 0o1777)
            return True
        except OSError:
            try:
                libc.umount("/dev")  # back to the host's /dev (MNT_DETACH takes the binds too)
            except OSError:
                pass
            return False
    finally:
        for fd in fds.values():
            os.close(fd)


def _private_shm(libc: _Libc, opts: str) -> bool:
    """Mount a private tmpfs on /dev/shm (in the new /dev, or over the host's)."""
    try:
        libc.mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, opts)
        return True
    except OSError:
        return False


# /proc entries that act on the whole machine: read-only. As uid 0 the child passes the DAC
# checks on them, and most handlers check no capability (a write to /proc/sysrq-trigger can
# reboot the machine, /proc/sys changes kernel settings, /proc/driver/nvidia/suspend suspends
# the GPU). The same list as Docker's read-only paths, plus driver.
_PROC_READONLY = ("sys", "sysrq-trigger", "bus", "fs", "irq", "driver")
# Kernel internals a candidate has no business reading: masked with /dev/null.
_PROC_MASKED = ("kcore", "keys", "timer_list", "sched_debug", "latency_stats")


def _protect_proc(libc: _Libc) -> bool:
    """Bind the machine-wide parts of the /proc mounted now read-only, mask a few files."""
    try:
        for name in _PROC_READONLY:
            path = f"/proc/{name}"
            if os.path.lexists(path):
                libc.mount(path, path, None, MS_BIND | MS_REC)
                libc.mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        for name in _PROC_MASKED:
            path = f"/proc/{name}"
            if os.path.isfile(path):
                libc.mount("/dev/null", path, None, MS_BIND)
                libc.mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
        return True
    except OSError:
        return False


_MOUNT_FLAG_OPTS = {
    "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME,
}


def _readonly_except(libc: _Libc, writable: list[str], check: list[str]) -> bool:
    """Every mount read-only but the ``writable`` mounts themselves; True once ``check`` is read-only."""
    try:
        libc.mount_setattr("/", MOUNT_ATTR_RDONLY, 0)  # recursive: every mount in the view
        for path in writable:
            # Not recursive: what is mounted below a writable mount (the checkout or venv bound
            # back under /tmp) keeps its read-only flag.
            libc.mount_setattr(path, 0, MOUNT_ATTR_RDONLY, recursive=False)
    except OSError:
        _remount_readonly(libc, writable)
    return _all_readonly(check)


def _remount_readonly(libc: _Libc, writable: list[str]) -> None:
    """Kernels before 5.12: one bind-remount per mount, keeping each mount's other flags."""
    try:
        with open("/proc/self/mountinfo") as f:
            entries = [line.split() for line in f]
    except OSError:
        return
    # A remount by path reaches the mount on top at that point: the last one listed there.
    # (Remounting an earlier, covered entry's path would hit the top one, /tmp's new tmpfs say.)
    top: dict[str, str] = {}
    for fields in entries:
        top[_unescape(fields[4])] = fields[5]
    for mnt, opts in top.items():
        if mnt in writable:  # exactly: mounts below a writable one stay read-only
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for opt in opts.split(","):
            flags |= _MOUNT_FLAG_OPTS.get(opt, 0)
        try:
            libc.mount(None, mnt, None, flags)
        except OSError:
            pass  # _all_readonly decides whether the view is read-only enough


def _all_readonly(paths: list[str]) -> bool:
    """Whether the mount each existing path lies on is read-only (statvfs: what a write would meet)."""
    for path in paths:
        if not os.path.lexists(path):
            continue  # nothing there to write to; its parent's mount is checked through "/"
        try:
            if not os.statvfs(path).f_flag & os.ST_RDONLY:
                return False
        except OSError:
            return False
    return True


def _teardown(init_pid: int | None) -> None:
    """After the child's exit: nothing it started may outlive it."""
    if init_pid is not None:
        try:
            os.kill(init_pid, signal.SIGKILL)  # the kernel kills every process in the namespace
        except OSError:
            pass
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if init_pid is None:
            # No PID namespace: kill our descendants (orphans are ours: subreaper) by /proc scan.
            for pid in _descendants(os.getpid()):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.002)


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
            ppid = int(data[data.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _unescape(path: str) -> str:
    """Undo /proc/self/mountinfo's octal escapes (\\040 for a space, ...)."""
    parts = path.split("\\")
    out = [parts[0]]
    for part in parts[1:]:
        if len(part) >= 3 and all(c in "01234567" for c in part[:3]):
            out.append(chr(int(part[:3], 8)) + part[3:])
        else:
            out.append("\\" + part)
    return "".join(out)


# ==== shim: end =============================================================================

_shim_source_cache: list[str] = []


def _shim_source() -> str:
    """The shim section of this file, plus the call that runs it."""
    if not _shim_source_cache:
        text = Path(__file__).read_text()
        begin = text.index("# ==== shim: begin")
        end = text.index("# ==== shim: end")
        _shim_source_cache.append(text[begin:end] + "\n_shim_main(sys.argv[1])\n")
    return _shim_source_cache[0]
