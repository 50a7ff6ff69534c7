"""Model servers started ahead of need: sandboxed, torch imported, CUDA context made, waiting.

TRUSTED SIDE: this runs in the harness (env_pool/trusted/harness.py). A server (env_pool/candidate/serve.py)
started here runs only trusted code until it is given its run: the sandbox, torch's import,
a CUDA context and the fallback detector's first use (serve.warm_up), then it blocks reading
its stdin. Each server is given exactly one run and is discarded after it, so nothing one
candidate did can reach another; only the start-up is shared, never a process.

Giving a server its run (``Server.give``), in this order:
- the candidate's files are moved into the server's own folder (its cwd and only writable
  folder, fixed when the sandbox was built); the sealed libraries keep their inodes;
- the round memory's file descriptors go over a socket (SCM_RIGHTS): they exist per task;
- the server's processes are moved from the builds' CPUs, where the start-up ran, to the
  servers' sampled CPUs, every thread checked (sandbox.WarmStart), and only then is its payload
  written: its wall-clock limit runs from there.

The pool keeps ``env.warm_servers`` servers per start settings (ServerSpec); a request whose
settings differ discards them and starts its own. The baselines' trusted servers have a pool of
their own (``env.warm_baseline_servers``, ServerPools), quieted with the candidates'. Where a start-up would disturb a timed run,
the waiting servers are paused (SIGSTOP) while timed rounds run, and the pool is refilled only
after a run ends (``refill``), not as a server is taken (a start-up begun as timed rounds begin
escapes the pause in its first instants). That is so on a harness with few CPUs of its own (on
2 cores, a start-up disturbed the harness's clock: the eager baseline at the clock's floor),
and on a GPU, whatever the CPUs: a start-up's CUDA context and first kernels share the device
with the timed run (on the H100 a sweep's first baselines, timed while six servers started and
load_inline builds ran, came out 2.2-3.8x slower than KernelBench's; the builds now keep off the
harness's CPUs: split_cpus in env_pool/evaluate.py).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import msgpack

from env_pool.build.compile import EXTENSIONS
from env_pool.candidate.serve import DEVICE_ENV, FD_SOCKET_ENV, WARM_BYTE
from env_pool.isolation.sandbox import SandboxError, SandboxLimits, SandboxOutcome, WarmStart, run_sandboxed

# -P: the scratch folder (the server's cwd) is not put first on sys.path, so a candidate's
# msgpack.py or torch.py cannot replace what the server imports before its guards are armed.
SERVER = [sys.executable, "-P", "-m", "env_pool.candidate.serve"]
# glibc's heap for every server alike, the baselines' too: allocations up to 32 MiB (its largest
# threshold) from the heap, and a freed top never handed back. With its defaults a round's fresh
# 16 MiB output was a new mapping or a regrown heap in some rounds and not others: its page faults
# put an eager ReLU at 2.7 ms in one server and 10 ms in the next, on the same machine.
STEADY_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}
REPORT_BYTES = 64 << 10  # a server's report is a few lines of text; more is dropped (and fails a candidate)
CONTENDED_CPUS = 2  # a harness with this many CPUs or fewer pauses waiting servers during timed rounds


@dataclass(frozen=True)
class ServerSpec:
    """What a server is started with (everything but its run): servers are pooled per spec."""

    device: str  # cpu or cuda
    threads: int
    wall_s: float  # the run's limit, from the moment it is given
    memory_mb: int
    hidden: tuple[str, ...]  # paths the server must not see
    required: tuple[str, ...]  # isolation it must have (sandbox.UNTRUSTED_ISOLATION, cpu-affinity)
    cpus: tuple[int, ...]  # the servers' CPUs, where it runs once given (empty: anywhere)
    startup_cpus: tuple[int, ...]  # where its start-up runs until it is given (empty: the harness's own)
    trusted: bool  # serves the baselines: writes the shared inductor cache, no read-only root
    inductor_dir: str  # a trusted server's shared inductor cache ("" for candidates: their own folder's)
    root: str  # the folder that holds each server's own working folder


def compile_env(inductor_dir: str, threads: int) -> dict[str, str]:
    """What torch.compile reads from a server's environment (env_pool/trusted/baseline_compile.py compiles ahead under the same)."""
    # Inductor's compile-worker pool (one process per CPU) would blow the memory limit for a
    # baseline that compiles in seconds in-process.
    return {"OMP_NUM_THREADS": str(threads), "TORCHINDUCTOR_CACHE_DIR": inductor_dir, "TORCHINDUCTOR_COMPILE_THREADS": "1"}


class Server:
    """One sandboxed server: started now, given one run later (or discarded)."""

    def __init__(self, spec: ServerSpec, cwd: Path | None = None):
        self.spec = spec
        self.cwd = cwd or Path(spec.root) / f"server-{uuid.uuid4().hex}"
        self.own_cwd = cwd is None  # a folder of its own: removed with it
        self.warm = False  # taken from the pool's waiting servers (not started for the request that got it)
        self.cwd.mkdir(parents=True, exist_ok=True)
        self.start = WarmStart()
        self.box: dict = {}
        self._started = False
        self.ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.thread = threading.Thread(target=self._run, args=(theirs,), daemon=True)
        self.thread.start()

    def _run(self, theirs: socket.socket) -> None:
        spec = self.spec
        limits = SandboxLimits(wall_s=spec.wall_s, memory_mb=spec.memory_mb, use_gpu=spec.device == "cuda",
                               max_result_bytes=REPORT_BYTES, hidden_paths=[Path(h) for h in spec.hidden],
                               # Every server, trusted or not, is frozen outside its rounds' timed windows.
                               required_isolation=(*spec.required, "cgroup-freeze"),
                               # The baselines' server writes the shared inductor cache; it runs trusted code only.
                               skip_isolation=("readonly-root",) if spec.trusted else (),
                               # Start-up runs off the servers' and the harness's CPUs; give() moves it to the servers'.
                               cpus=(spec.startup_cpus or tuple(sorted(os.sched_getaffinity(0)))) if spec.cpus else ())
        env = {**compile_env(spec.inductor_dir or str(self.cwd / ".inductor"), spec.threads), **STEADY_MALLOC,
               "TORCH_EXTENSIONS_DIR": str(self.cwd / EXTENSIONS), DEVICE_ENV: spec.device,
               FD_SOCKET_ENV: str(theirs.fileno()), "PYTHONPATH": os.pathsep.join(x for x in sys.path if x)}
        try:
            self.box["outcome"] = run_sandboxed(SERVER, self.start, self.cwd, limits, env, pass_fds=(theirs.fileno(),))
        except SandboxError as err:
            self.box["error"] = err
        finally:
            theirs.close()

    @property
    def waiting(self) -> bool:
        """Started, alive, and not yet given a run."""
        return self.thread.is_alive() and not self.start.given

    @property
    def started(self) -> bool:
        """Its start-up done: it said so on its socket (before its run, when only trusted code runs there)."""
        if not self._started and not self.start.given:
            try:
                self._started = self.ours.recv(1, socket.MSG_DONTWAIT) == WARM_BYTE
            except (BlockingIOError, InterruptedError):
                pass
        return self._started

    @property
    def outcome(self) -> SandboxOutcome | None:
        return self.box.get("outcome")

    def take_files(self, scratch: Path) -> None:
        """Copy the candidate's files (sources, its sealed kernel.so, its load_inline build) into this server's folder.

        Copied, not moved: a retry of the same request (harness.handle, after the harness ran out
        of device memory) takes them again into a fresh server; moved, they were gone, and a correct
        kernel on one of KernelBench's 6 GiB problems came back a compile error (H100 sweep).
        ``cp -a`` keeps links as links and every owner and mode: a sealed library stays sealed.
        """
        if scratch.resolve() == self.cwd.resolve():
            return
        entries = [e for e in scratch.iterdir() if e.name != "tmp"]  # tmp: the sandbox's own; this server has its own
        for entry in entries:
            target = self.cwd / entry.name
            if target.is_dir() and not target.is_symlink():  # made by the server's start-up (a cache folder)
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
        if entries:
            subprocess.run(["cp", "-a", "--", *map(str, entries), str(self.cwd)], check=True, capture_output=True)

    def give(self, payload: dict, fds: tuple[int, int]) -> None:
        """The run: the round memory's descriptors, then the payload (and the move to the servers' CPUs)."""
        # Continued first: a server given its run never depends on quiet() having continued it
        # after another run's timed rounds (a stopped server would never read its run).
        self.start.resume()
        socket.send_fds(self.ours, [b"fds"], list(fds))
        self.start.give(msgpack.packb(payload), self.spec.cpus)

    def pids(self) -> set[int]:
        """The run's processes (the shim, its descendants, its cgroups' members), as this process's PID namespace numbers them."""
        return self.start.members() if self.start.members is not None else set()

    def finish(self) -> None:
        """After its run, or instead of one: the process gone, its folder removed."""
        self.start.cancel()  # a no-op for a server that was given its run
        self.thread.join()
        self.ours.close()
        if self.start.freezer is not None:
            self.start.freezer.close()
        if self.own_cwd:
            shutil.rmtree(self.cwd, ignore_errors=True)


def contended() -> bool:
    """Whether this harness has so few CPUs that a server's start-up would disturb its timed rounds."""
    return len(os.sched_getaffinity(0)) <= CONTENDED_CPUS


def log(line: str) -> None:
    """One line of the harness's log (its stderr: the worker's harness.log), timestamped: what a stalled sweep was doing."""
    print(f"{time.strftime('%H:%M:%S')} {line}", file=sys.stderr, flush=True)


class ServerPool:
    """Waiting servers of one spec, refilled as they are taken (after the run, where timed rounds are shielded)."""

    def __init__(self) -> None:
        self.spec: ServerSpec | None = None
        self.waiting: list[Server] = []

    def take(self, spec: ServerSpec, keep: int) -> Server:
        """A waiting server of ``spec`` (or one started now), and the pool refilled to ``keep`` unless shielded."""
        if spec != self.spec:
            if self.waiting:
                log(f"{len(self.waiting)} waiting servers closed: the next request's settings differ")
            self.close()
            self.spec = spec
        for dead in [s for s in self.waiting if not s.waiting]:  # its start-up failed: not for a run
            self.waiting.remove(dead)
            dead.finish()
            ended = dead.outcome
            why = f"{ended.failure or 'exit ' + str(ended.returncode)}: {ended.output.strip()[-300:]}" if ended else dead.box.get("error")
            log(f"a waiting {'trusted ' if spec.trusted else ''}server ended before its run ({why})")
        # One whose start-up is done, else the oldest (the furthest along).
        server = next((s for s in self.waiting if s.started), self.waiting[0] if self.waiting else None)
        if server is not None:
            self.waiting.remove(server)
            server.warm = True
        server = server or Server(spec)
        if not self.shielded():
            self.refill(keep)
        return server

    def refill(self, keep: int) -> None:
        """Start servers of the current spec until ``keep`` wait."""
        while self.spec is not None and len(self.waiting) < keep:
            self.waiting.append(Server(self.spec))

    @contextlib.contextmanager
    def quiet(self, timed: bool):
        """Timed rounds on a harness with few CPUs: the waiting servers stopped meanwhile."""
        pause = timed and self.shielded()
        if pause:
            for s in self.waiting:
                s.start.pause()
        try:
            yield
        finally:
            if pause:
                for s in self.waiting:
                    s.start.resume()

    def shielded(self) -> bool:
        """Whether timed rounds are shielded from start-ups: waiting servers paused, the pool refilled after the run."""
        return contended() or (self.spec is not None and self.spec.device == "cuda")

    def close(self) -> None:
        for s in self.waiting:
            s.finish()
        self.waiting = []


class ServerPools:
    """The harness's two pools: the candidates' servers and the baselines' trusted servers.

    A trusted server runs the task's reference only (eager, then torch.compile) and, like a
    candidate's, serves one run: pooled, a task's first baselines skip its start-up (5-7 s of
    torch and a CUDA context on the H100 host). Timed rounds quiet both pools.
    """

    def __init__(self) -> None:
        self.candidates, self.baselines = ServerPool(), ServerPool()

    def of(self, trusted: bool) -> ServerPool:
        return self.baselines if trusted else self.candidates

    @contextlib.contextmanager
    def quiet(self, timed: bool):
        with self.candidates.quiet(timed), self.baselines.quiet(timed):
            yield

    def close(self) -> None:
        self.candidates.close()
        self.baselines.close()
