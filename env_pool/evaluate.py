"""One evaluation of one candidate: compile, then the rounds, judged by the trusted harness.

The steps, and who decides what:
1. compile: the fast path (kernel.cpp / kernel.cu, no torch headers) in a sandboxed compiler,
   or, for a KernelBench-style solution, an import in a sandboxed child under the compile time
   limit that runs its load_inline build.
2. the worker's harness (env_pool/trusted/harness.py: a trusted process, kept warm; no candidate code
   runs in it) holds the device's timing lane for the whole run. It times the eager and torch.compile baselines
   in a trusted server (once per task per worker), then serves the candidate's server
   (env_pool/candidate/serve.py, sandboxed) round after round: fresh inputs every round, its own clock,
   every output verified against the reference it runs itself.
3. here, the harness's verdict becomes an EvalResult and the milestone reward. Nothing in it
   comes from the candidate's process except as data the harness checked (outputs) or as
   text that can only fail the candidate (error messages, guard violations).
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import msgpack

from env_pool.build import cuda_arch, inline_pch, paper_layout

from env_pool.build.compile import BACKENDS, EXTENSIONS, cache_key, compile_kernel
from env_pool.isolation import host_pressure
from env_pool.isolation.sandbox import UNTRUSTED_ISOLATION, SandboxError, SandboxLimits, SandboxOutcome, run_sandboxed
from env_pool.reward import apply_reward, stretch_drift
from env_pool.trusted.code_sampler import TooManyLibraries, own_libraries
from env_pool.trusted.harness_process import HarnessProcess
from env_pool.trusted.harness_request import HarnessRequest
from env_pool.trusted.round_protocol import MIN_NET_MS
from protocol.results import FAILURE_KINDS, EvalResult, InputCheck, Timing, Violation
from tasks.rules import rules_named
from tasks.solution import FIXED_FILES, SOLUTION_FILE, solution_file_name_ok, uses_extension_module
from tasks.task import Task

# -P: the scratch folder (the cwd) is not put first on sys.path, so a candidate's msgpack.py or
# torch.py cannot replace what the runner imports before its guards are armed.
RUNNER = [sys.executable, "-P", "-m", "env_pool.candidate.runner"]
MODES = ("compile", "verify", "full")  # full = verify + profile
HARNESS_START_S = 120.0  # a (re)start of the harness (torch, CUDA, the reference) on top of its servers' limits
HARNESS_CPUS = 2  # the harness's own CPUs where the worker has more than servers + this: its spinning thread, its sampler
UNTIMEABLE_STRIKES = 3  # baseline measurements in a row within the protocol's noise before a task's speed goes unjudged
# The eager recheck this far from the cached eager timing (env_pool/reward.stretch_drift): the
# baselines were cached in a stretch unlike the candidate's, or were disturbed past their
# plausibility check, and are timed again for the next evaluation. This one is judged with its
# intervals widened as by any drift: denying it its speed outright, on the 2-core VM (stretches
# 50-80% apart in a noisy hour), took "faster than eager" from an argmax kernel 2.5x faster
# than eager in 4 of 8 evaluations.
STALE_STRETCH = 0.5
UNTIMEABLE_TTL_S = 1800.0  # how long that lasts before the baselines are measured again (a loaded machine may have caused it)


@dataclass
class Baseline:
    """Eager and torch.compile timings of a task's reference, measured once per worker."""

    eager: Timing
    compiled: Timing


class BuildGate:
    """Builds and baseline timing kept apart where the builds' CPUs are the timed runs' too.

    A task's baselines are kept for the worker's life, so they are timed on a quiet worker: a
    build (a compile, a load_inline import) on the CPUs of the servers or of the harness's
    clock waits while baselines are timed, and the timing waits for the builds already
    running. On a machine with CPUs to spare the builds have their own (split_cpus), and the
    gate never closes. Threads, not asyncio: builds run in worker threads, and a worker's
    context outlives event loops.
    """

    def __init__(self, shared: bool):
        self.shared = shared  # the builds' CPUs are the servers' or the harness's
        self._cond = threading.Condition()
        self._builds = 0
        self._timing = 0

    @contextlib.contextmanager
    def build(self):
        with self._cond:
            self._cond.wait_for(lambda: not (self.shared and self._timing))
            self._builds += 1
        try:
            yield
        finally:
            with self._cond:
                self._builds -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def baselines(self):
        with self._cond:
            self._timing += 1  # first: no build starts from here on
            self._cond.wait_for(lambda: not (self.shared and self._builds))
        try:
            yield
        finally:
            with self._cond:
                self._timing -= 1
                self._cond.notify_all()


class WorkerUnhealthy(RuntimeError):
    """This worker's device was found hung: evaluations fail as infra, to be retried elsewhere."""


@dataclass
class EvalContext:
    """What one worker keeps between evaluations."""

    cfg: Any  # EnvConfig (a DictConfig or the dataclass)
    baselines: dict[tuple[str, str], Baseline] = field(default_factory=dict)
    lane: asyncio.Lock = field(default_factory=asyncio.Lock)  # one timed run per device at a time
    unhealthy: str = ""  # why the device is unusable (set by env_pool/device_watch.py); empty while healthy
    after_timeout: Any = None  # async callable run, lane still held, when a timed run times out (device_watch.py)
    untimeable: dict[tuple[str, str], tuple[int, float, str]] = field(default_factory=dict)  # (strikes, since, why) per task
    _harness: HarnessProcess | None = None
    _compiles: asyncio.Semaphore | None = None
    _gate: BuildGate | None = None

    def __post_init__(self) -> None:
        if self.cfg is not None:  # a timing setting that cannot hold fails here, not in each evaluation
            times_in_turn(self.cfg, str(self.cfg.backend))
            if int(self.cfg.calls_per_round) < 0 or int(self.cfg.round_memory_mb) < 1:
                raise ValueError(f"env.calls_per_round={self.cfg.calls_per_round} and env.round_memory_mb="
                                 f"{self.cfg.round_memory_mb}: calls_per_round is 0 (chosen per task) or a count of "
                                 "calls, round_memory_mb a positive size in MB")

    @property
    def gate(self) -> BuildGate:
        """Builds wait while baselines are timed, where they share CPUs with the timed runs."""
        if self._gate is None:
            plan = split_cpus(int(self.cfg.threads))
            self._gate = BuildGate(bool(set(plan.builds) & set(plan.servers + plan.harness)))
        return self._gate

    def strike(self, key: tuple[str, str], why: str) -> bool:
        """One more baseline of ``key`` within the protocol's noise; True once its speed goes unjudged."""
        strikes = self.untimeable.get(key, (0, 0.0, ""))[0] + 1
        self.untimeable[key] = (strikes, time.monotonic(), why)
        return strikes >= UNTIMEABLE_STRIKES

    def unjudged_speed(self, key: tuple[str, str]) -> str:
        """Why ``key``'s speed is not judged on this worker now ("" while it is)."""
        strikes, since, why = self.untimeable.get(key, (0, 0.0, ""))
        if strikes < UNTIMEABLE_STRIKES:
            return ""
        if time.monotonic() - since > UNTIMEABLE_TTL_S:
            del self.untimeable[key]
            return ""
        return why

    @property
    def harness(self) -> HarnessProcess:
        """The worker's trusted harness, started on first use; it spins on CPUs other than the servers'."""
        if self._harness is None:
            self._harness = HarnessProcess(self.work_dir / "harness.log", split_cpus(int(self.cfg.threads)).harness,
                                           {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
        return self._harness

    def close(self) -> None:
        """End the harness (and its servers) if it was started; the next evaluation starts another."""
        if self._harness is not None:
            self._harness.close()

    @property
    def compile_slots(self) -> asyncio.Semaphore:
        """At most env.compile_workers compiles at once (0: one per CPU left for builds); the rest wait.

        Builds are pinned to those CPUs, so more at once would not finish sooner, and each g++ or
        nvcc of torch's headers holds 1-2 GB: a burst of episodes must not run a worker out of memory."""
        if self._compiles is None:
            workers = int(self.cfg.compile_workers) or len(split_cpus(int(self.cfg.threads)).builds)
            self._compiles = asyncio.Semaphore(max(1, workers))
        return self._compiles

    @contextlib.asynccontextmanager
    async def timing_lane(self):
        """The lane, refused once the device is unhealthy (runs queued behind a hang fail at once)."""
        async with self.lane:
            if self.unhealthy:
                raise WorkerUnhealthy(self.unhealthy)
            yield

    @property
    def work_dir(self) -> Path:
        return Path(os.path.expanduser(self.cfg.work_dir))

    @property
    def private_paths(self) -> list[Path]:
        """What a candidate's process must not see: the reference's folder, other candidates' compiled
        kernels, the harness's log, and the agents' workspaces: each would hand it a reference or a solution."""
        return [self.reference_dir, self.work_dir / "kernels", self.work_dir / "harness.log", self.work_dir / "workspaces"]

    @property
    def reference_dir(self) -> Path:
        """The trusted side's folder: expected outputs and the inductor cache. Hidden from candidates."""
        return self.work_dir / "reference"


async def evaluate(ctx: EvalContext, task: Task, files: Mapping[str, str], mode: str = "full") -> EvalResult:
    """Evaluate a candidate's files on a task; never raises for anything the candidate did."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    start = time.perf_counter()
    backend = str(ctx.cfg.backend)
    result = EvalResult(task_id=task.id, backend=backend)
    scratch = ctx.work_dir / "scratch" / uuid.uuid4().hex
    private = ctx.reference_dir / "private" / uuid.uuid4().hex
    try:
        scratch.mkdir(parents=True)
        private.mkdir(parents=True, mode=0o700)
        await _run_steps(ctx, task, dict(files), mode, backend, scratch, private, result)
    except WorkerUnhealthy as err:
        _set_failure(result, "infra", f"this worker's device is unhealthy ({err}); retry the evaluation on another worker")
    except (SandboxError, OSError) as err:  # the environment's own fault: the pool retries it
        _set_failure(result, "infra", f"the environment failed: {type(err).__name__}: {err}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)
    result.wall_s = time.perf_counter() - start
    # One rule for every mode: a failure or an unchecked result is FAIL; without timings, CORRECT at most.
    return apply_reward(result, ctx.cfg.reward)


async def measure_baselines(ctx: EvalContext, task: Task) -> Baseline | str:
    """A task's eager and torch.compile baselines on this worker, as a full evaluation would take them; or why not.

    Measured once per worker (ctx.baselines), by the harness's baselines-only request: the same
    trusted server, protocol and plausibility rules as a task's first full evaluation, without a
    candidate. For sweeps that compare the environment's baselines with published ones.
    """
    backend = str(ctx.cfg.backend)
    key = (task.id, backend)
    if key in ctx.baselines:
        return ctx.baselines[key]
    scratch = ctx.work_dir / "scratch" / uuid.uuid4().hex
    private = ctx.reference_dir / "private" / uuid.uuid4().hex
    try:
        scratch.mkdir(parents=True)
        private.mkdir(parents=True, mode=0o700)
        async with ctx.timing_lane():
            verdict = await _harness(ctx, task, backend, "baselines", True, scratch, private)
        verdict = await asyncio.to_thread(machine_at_fault, verdict, split_cpus(int(ctx.cfg.threads)).servers, ctx.harness)
    except WorkerUnhealthy as err:
        return f"this worker's device is unhealthy ({err})"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)
    if verdict.get("untimeable"):
        ctx.strike(key, verdict["message"])
    verdict = keep_baselines(ctx, key, verdict)
    return ctx.baselines.get(key) or str(verdict.get("message") or "the harness returned no baselines")


async def _run_steps(ctx, task, files, mode, backend, scratch, private, result) -> None:
    if SOLUTION_FILE not in files:
        return _set_failure(result, "missing_files", f"{SOLUTION_FILE} is missing: it must define class ModelNew")
    write_candidate(scratch, files)
    if not await _compile_step(ctx, files, backend, scratch, result) or mode == "compile":
        return
    key = (task.id, backend)
    # A task whose reference runs within the timing protocol's noise here cannot be timed: its
    # candidates are verified only (CORRECT at most), instead of measuring its baselines again and
    # again, each time in vain.
    unjudged = ctx.unjudged_speed(key) if mode == "full" else ""
    mode = "verify" if unjudged else mode
    # Timed in turn with the candidate, every full evaluation's baselines are its own (env.baseline_timing).
    baseline = mode == "full" and (times_in_turn(ctx.cfg, backend) or key not in ctx.baselines)
    async with ctx.timing_lane():  # the baselines and the candidate's rounds are all timed runs
        verdict = await _harness(ctx, task, backend, mode, baseline, scratch, private)
        if verdict.get("untimeable") and ctx.strike(key, verdict["message"]):
            unjudged, mode = verdict["message"], "verify"
            verdict = await _harness(ctx, task, backend, mode, False, scratch, private)
        if verdict.get("failure") == "timeout" and ctx.after_timeout is not None:
            await ctx.after_timeout()  # before the lane is released: the next run must not start on a hung device
    verdict = await asyncio.to_thread(machine_at_fault, verdict, split_cpus(int(ctx.cfg.threads)).servers, ctx.harness)
    if verdict.get("in_turn"):
        verdict = plausible_in_turn(verdict)
    elif baseline:
        verdict = keep_baselines(ctx, key, verdict)
    _judge(ctx, key, verdict, result, timed=mode == "full")
    if stretch_drift(result) > STALE_STRETCH:  # cached in another stretch, or disturbed: timed again next time
        ctx.baselines.pop(key, None)
    if unjudged and result.failure is None:
        result.message = (f"speed not judged: this task's reference runs within the timing protocol's own noise on "
                          f"this worker ({unjudged.removesuffix('; retried')}); correctness only")


def write_candidate(scratch: Path, files: Mapping[str, str]) -> None:
    """A solution's sources, headers and .py files into its scratch folder, at the root or in kernels/
    (other names are the agent's notes); one in the paper's layout gets the environment's fixed files."""
    paper = uses_extension_module(files)
    for name, text in files.items():
        if solution_file_name_ok(name) and not (paper and name in FIXED_FILES):
            (scratch / name).parent.mkdir(exist_ok=True)
            (scratch / name).write_text(text)
    if paper:
        paper_layout.install_fixed_files(scratch)


async def _compile_step(ctx, files, backend, scratch, result) -> bool:
    spec = BACKENDS[backend]
    if spec.source in files and not uses_extension_module(files):
        async with ctx.compile_slots:
            built = await asyncio.to_thread(_gated, ctx.gate, compile_kernel, files, backend, ctx.work_dir / "kernels",
                                            ctx.cfg.compile_timeout_s, extra_flags=build_flags(ctx.cfg, backend),
                                            cpus=tuple(split_cpus(int(ctx.cfg.threads)).builds))
        result.compile_s, result.cache_hit, result.compile_log = built.seconds, built.cache_hit, built.log
        if not built.ok:
            return _set_failure(result, "infra" if built.infra else "compile_error", "compile failed:\n" + built.log)
        shutil.copyfile(built.library, scratch / "kernel.so")
        if not seal(scratch / "kernel.so"):
            return _set_failure(result, "infra", "the compiled kernel.so could not be sealed in the scratch folder")
        return True
    if "cpp_extension" not in files[SOLUTION_FILE] and not uses_extension_module(files):
        return True  # plain Python: the candidate's own server imports it
    # KernelBench path: importing model_new.py runs its load_inline build, under the compile limit;
    # the paper's layout: the import child builds its cuda_extension first (env_pool/build/paper_layout.py).
    # The same files built before on this worker: their build is copied in, and the import skipped
    # (the server's own import still fails a solution that does not load).
    cached = inline_cache(ctx, files, backend)
    begin = time.perf_counter()
    if cached.is_dir():
        shutil.copytree(cached, scratch / EXTENSIONS, symlinks=True)
        result.cache_hit = True
    else:
        async with ctx.compile_slots:  # the import runs the solution's load_inline build
            begin = time.perf_counter()  # its time, not the wait for a slot
            outcome, payload = await _import_step(ctx, backend, scratch)
        if outcome.failure or not payload.get("ok"):
            result.compile_s = time.perf_counter() - begin
            result.compile_log = (payload.get("error") or "") + "\n" + outcome.output[-3000:]
            kind = "timeout" if outcome.timed_out else "compile_error"
            why = payload.get('error') or f"{outcome.failure} ({outcome.signal_name or f'exit {outcome.returncode}'})"
            if outcome.failure in ("timeout", "out_of_memory"):  # the build's limits, or the machine's shortage?
                machine = await asyncio.to_thread(host_pressure.note, split_cpus(int(ctx.cfg.threads)).builds,
                                                  cpu=outcome.failure == "timeout")
                if machine:
                    kind, why = "infra", f"{why}, but the fault is the machine's: {machine}"
            return _set_failure(result, kind, f"importing {SOLUTION_FILE} failed: {why}")
        oversized = build_bounds(scratch / EXTENSIONS)
        if oversized:
            result.compile_s = time.perf_counter() - begin
            return _set_failure(result, "compile_error", f"importing {SOLUTION_FILE} left {oversized}: more than a build "
                                                         "makes (keep the import to load_inline's own build)")
        _store(scratch / EXTENSIONS, cached)
    result.compile_s = time.perf_counter() - begin
    # What the build left is the candidate's own code from here on (and only what it left now).
    try:
        libraries = own_libraries(scratch)
    except TooManyLibraries as err:
        return _set_failure(result, "compile_error", f"importing {SOLUTION_FILE}: {err}")
    if not all(seal(library, scratch) for library in libraries):
        return _set_failure(result, "compile_error", f"importing {SOLUTION_FILE} left a library that is not a file of its own")
    return True


MAX_BUILD_FILES = 256  # a load_inline build folder holds its sources, ninja's files, objects and a library
MAX_BUILD_MB = 128  # apparent size: a sparse file counts at its length (a 1 GiB hole would fill the cache's disk: corpus rt3_inline_cache_sparse_fill)


def build_bounds(folder: Path) -> str:
    """What is too much in an import step's build folder ("" when it is a build's size): it is kept
    in the worker's cache for later evaluations, so its size is the worker's disk."""
    count = size = 0
    for root, dirs, names in os.walk(folder):  # symlinks are not followed (they are counted, never read)
        for name in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            count += 1
            try:
                size += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    if count > MAX_BUILD_FILES:
        return f"{count} files (at most {MAX_BUILD_FILES})"
    if size > MAX_BUILD_MB << 20:
        return f"{size >> 20} MB (at most {MAX_BUILD_MB} MB)"
    return ""


def machine_at_fault(verdict: dict, cpus: list[int], harness: HarnessProcess | None = None) -> dict:
    """A verdict of timeout or out of memory, read again against the machine (env_pool/isolation/host_pressure.py).

    Short of memory, or its servers' CPUs held by other processes, the machine is to blame, not
    the candidate's or the baselines' limits: the verdict becomes infra (retried), its message
    says so with the numbers, and harness.log records it. Read once the run is over, so its own
    processes are gone. A guard's violation stands, whatever the machine did.
    """
    kind = verdict.get("failure")
    if kind not in ("timeout", "out_of_memory") or verdict.get("violations"):
        return verdict
    machine = host_pressure.note(cpus, cpu=kind == "timeout")
    if not machine:
        return verdict
    first, _, rest = str(verdict.get("message", "")).partition("\n")
    blamed = f"{first}, but the fault is the machine's: {machine}"
    if harness is not None:
        harness.record(blamed)
    return {**verdict, "failure": "infra", "message": blamed + (f"\n{rest}" if rest else "")}


def build_flags(cfg, backend: str) -> tuple[str, ...]:
    """The rules' extra build flags (env.rules): the paper's nvcc builds with --use_fast_math."""
    return ("--use_fast_math",) if backend == "cuda" and rules_named(cfg.rules).fast_math else ()


def inline_cache(ctx, files: Mapping[str, str], backend: str) -> Path:
    """Where a load_inline solution's build is kept, keyed by its files, torch and the toolchain (a hidden folder)."""
    import torch

    flags = ("load_inline", torch.__version__, os.environ.get("TORCH_CUDA_ARCH_LIST", ""), "-march=native",
             *build_flags(ctx.cfg, backend))  # the paper layout's nvcc flags follow the rules
    return ctx.work_dir / "kernels" / "inline" / cache_key(files, backend, flags)


def _store(built: Path, cached: Path) -> None:
    """Keep a build for the next evaluation of the same files: copied whole, then renamed into place."""
    if not built.is_dir() or cached.exists():
        return
    staging = cached.with_name(f"{cached.name}.{uuid.uuid4().hex}")
    try:
        # symlinks=True: a link the candidate's build left is copied as a link, never followed here,
        # where the folders hidden from candidates are visible.
        shutil.copytree(built, staging, symlinks=True, ignore=shutil.ignore_patterns("*.o", ".ninja_*"))
        os.rename(staging, cached)
    except OSError:  # another worker stored it first, or the disk is full: the cache is only a shortcut
        shutil.rmtree(staging, ignore_errors=True)


def seal(target: Path, scratch: Path | None = None) -> bool:
    """Make a built library in the scratch folder unchangeable by the candidate's server.

    The harness's code sampler counts code in these files (by inode) as the candidate's own:
    were one writable, a candidate could overwrite it with a library's code before loading it.
    Read-only, and owned by nobody when this worker is root: the candidate's process has no
    capabilities, so it can neither write nor chmod it (replacing it makes a new inode).
    False, and nothing touched, for anything but a regular file inside ``scratch``: a root worker
    must never change a file the candidate merely pointed at (torch's own libraries, once).
    """
    inside = os.path.realpath(scratch or target.parent) + os.sep
    if target.is_symlink() or not target.is_file() or not os.path.realpath(target).startswith(inside):
        return False
    os.chmod(target, 0o555)
    if os.geteuid() == 0:
        os.chown(target, 65534, 65534, follow_symlinks=False)
    return True


def keep_baselines(ctx: EvalContext, key: tuple[str, str], verdict: dict) -> dict:
    """Cache the baselines a run measured if they are plausible; the verdict to judge.

    A baseline is cached for the worker's life, so a disturbed one must not stick. Without one a
    candidate the harness passed cannot be judged (infra: retried); one that failed on its own
    (wrong, a crash, a guard) is judged as it is: no baseline changes that verdict.
    """
    if not (verdict.get("eager") and verdict.get("compiled")):
        return verdict
    measured = Baseline(Timing(**verdict["eager"]), Timing(**verdict["compiled"]))
    if _plausible(measured):
        ctx.baselines[key] = measured
        ctx.untimeable.pop(key, None)
        return verdict
    passed = verdict.get("ok") and not verdict.get("failure") and not verdict.get("violations")
    if passed:
        return {"failure": "infra", "message": f"the baselines measured implausibly ({measured}); retried"}
    return verdict


def plausible_in_turn(verdict: dict) -> dict:
    """The verdict of baselines timed in turn with the candidate, which are never cached (a candidate
    beside their rounds may have disturbed them): implausible ones withhold the speed claim.

    Not infra, as cached ones are: a retry would time fresh baselines in fresh servers, a reroll
    a candidate could force whenever its odds looked poor.
    """
    if not (verdict.get("eager") and verdict.get("compiled") and verdict.get("candidate")):
        return verdict
    if _plausible(Baseline(Timing(**verdict["eager"]), Timing(**verdict["compiled"]))):
        return verdict
    kept = {k: v for k, v in verdict.items() if k != "candidate"}
    kept["timing_note"] = ("the baselines timed beside your rounds were too noisy to compare with (an IQR over twice "
                           "the median): speed not judged")
    return kept


def _plausible(base: Baseline) -> bool:
    """A baseline to keep: above the clock's floor, with an IQR below twice its median.

    A concurrent import child can storm the CPUs during a task's first baseline; cached, a
    floor-level or wildly noisy baseline would decide every later reward.
    """
    return all(t.median_ms > 2 * MIN_NET_MS and t.iqr_ms < 2 * t.median_ms for t in (base.eager, base.compiled))


@dataclass(frozen=True)
class CpuPlan:
    """Which of the worker's CPUs do what: timed runs, the clock, and everything else."""

    servers: list[int]  # the candidates' and the baselines' servers, in their runs
    harness: list[int]  # the harness: it spins on them and keeps the clock, so nothing else is put there
    builds: list[int]  # compiles, load_inline imports, servers' start-ups, the precompiled header's build


def cpu_share(cpus: list[int], rank: int, count: int) -> list[int]:
    """The ``rank``-th of ``count`` equal slices of ``cpus``; one CPU, shared, where there are fewer CPUs than slices."""
    part = cpus[rank * len(cpus) // count:(rank + 1) * len(cpus) // count]
    return part or [cpus[rank % len(cpus)]]


def split_cpus(threads: int) -> CpuPlan:
    """The first ``threads`` of this process's CPUs for the servers, the next HARNESS_CPUS for the harness, the rest for builds.

    The candidate and the baselines run on the same CPUs with the same thread count, so more
    threads than the reference is never a speedup. The harness has CPUs of its own where there
    are enough: on the H100 machine, twelve load_inline builds on its CPUs made a sweep's first
    baselines time 2.8-3.8x slower than KernelBench's (IQRs of 98-100% of the median). With few
    CPUs, the harness and the builds share what is left (and the servers' start-ups are paused
    during timed rounds: env_pool/trusted/server_pool.py).
    """
    mine = sorted(os.sched_getaffinity(0))
    servers = mine[:max(1, threads)]
    rest = mine[len(servers):] or mine
    harness = rest[:HARNESS_CPUS] if len(rest) > HARNESS_CPUS else rest
    return CpuPlan(servers, harness, rest[len(harness):] or harness)


async def _harness(ctx, task, backend, mode, baseline, scratch, private) -> dict:
    """One request to the worker's warm trusted harness (env_pool/trusted/harness_process.py); a request
    that times baselines runs with the worker's builds kept off the timing CPUs (BuildGate)."""
    cfg = ctx.cfg
    cached = None if baseline else ctx.baselines.get((task.id, backend))
    request = harness_request(cfg, task, backend, mode, baseline, Path(scratch), Path(private), ctx.reference_dir / "inductor",
                              ctx.private_paths, cached.eager.calls if cached else int(cfg.calls_per_round))
    in_turn = mode == "full" and request.in_turn
    recheck = mode == "full" and bool(cfg.eager_recheck)  # the eager baseline timed again after the candidate's rounds
    servers = int(cfg.turn_servers) if in_turn else int(cfg.baseline_servers) if baseline else 0
    limit = (HARNESS_START_S + cfg.run_timeout_s + servers * (cfg.run_timeout_s + cfg.compile_timeout_s)
             + (cfg.run_timeout_s if recheck else 0))
    return await asyncio.to_thread(_quiet_request, ctx, request, limit, baseline or recheck or mode == "baselines")


def harness_request(cfg, task: Task, backend: str, mode: str, baseline: bool, scratch: Path, private: Path,
                    inductor_dir: Path, hidden: list[Path], calls: int) -> HarnessRequest:
    """The harness's request for one evaluation, from the env config (env.*) and this worker's folders;
    ``calls`` a timed round: env.calls_per_round, or those of the cached baselines the candidate is compared with."""
    plan = split_cpus(int(cfg.threads))
    # Pinned on every backend while the code sampler runs: it samples the servers' CPUs only.
    pinned = backend == "cpp" or bool(cfg.code_sampling)
    return HarnessRequest(
        task=task.to_dict(), backend=backend, mode=mode, baseline=bool(baseline), rules=str(cfg.rules),
        threads=int(cfg.threads), cpus=tuple(plan.servers), startup_cpus=tuple(plan.builds),
        harness_cpus=tuple(plan.harness),
        warmup=int(cfg.warmup), repetitions=int(cfg.repetitions), eager_recheck=bool(cfg.eager_recheck),
        calls_per_round=int(calls), round_memory_mb=int(cfg.round_memory_mb),
        in_turn=times_in_turn(cfg, backend), turn_servers=int(cfg.turn_servers),
        baseline_servers=int(cfg.baseline_servers),
        correctness_inputs=int(cfg.correctness_inputs),
        adversarial_inputs=bool(cfg.adversarial_inputs), compile_mode=str(cfg.compile_mode), seccomp=bool(cfg.seccomp),
        keep_cpus_awake=bool(cfg.keep_cpus_awake),
        code_sampling=bool(cfg.code_sampling), memory_limit_mb=int(cfg.memory_limit_mb),
        baseline_memory_limit_mb=int(cfg.baseline_memory_limit_mb), warm_servers=int(cfg.warm_servers),
        warm_baseline_servers=int(cfg.warm_baseline_servers), run_timeout_s=float(cfg.run_timeout_s),
        baseline_timeout_s=float(cfg.run_timeout_s + cfg.compile_timeout_s), scratch=str(scratch),
        reference_cwd=str(private), inductor_dir=str(inductor_dir), hidden=tuple(str(p) for p in hidden),
        required_isolation=tuple(UNTRUSTED_ISOLATION) + (("cpu-affinity",) if pinned else ()))


def times_in_turn(cfg, backend: str) -> bool:
    """Whether a full evaluation times its own baselines in turn with the candidate (env.baseline_timing);
    a setting that cannot hold is a ValueError naming the fields and the fix."""
    timing = str(cfg.baseline_timing)
    if int(cfg.turn_servers) < 1:
        raise ValueError(f"env.turn_servers={cfg.turn_servers}: each baseline timed in turn needs at least 1 server. "
                         "Set env.turn_servers=2 (the default) or 1")
    if timing == "auto":
        return backend == "cpp" and not cfg.eager_recheck and int(cfg.baseline_servers) <= 1
    if timing == "in_turn" and backend == "cuda":
        raise ValueError("env.baseline_timing=in_turn is for the cpp backend only: on a GPU a frozen candidate's queued "
                         "work runs on into the next baseline's round. Set env.baseline_timing=cached (or auto)")
    if timing == "in_turn" and (cfg.eager_recheck or int(cfg.baseline_servers) > 1):
        raise ValueError("env.eager_recheck and env.baseline_servers > 1 are for cached baselines; with "
                         "env.baseline_timing=in_turn each evaluation times its own in one pair of servers. Set "
                         "env.eager_recheck=false and env.baseline_servers=1, or env.baseline_timing=cached")
    return timing == "in_turn"


def _quiet_request(ctx, request: HarnessRequest, limit: float, baselines: bool) -> dict:
    with ctx.gate.baselines() if baselines else contextlib.nullcontext():
        return ctx.harness.request(request, limit)


async def _import_step(ctx, backend, scratch) -> tuple[SandboxOutcome, dict]:
    """The load_inline build, off the device where it can be (an import on it would share it with timed runs).

    On the cuda backend the import child runs without the GPU, torch given the device's
    architecture instead (TORCH_CUDA_ARCH_LIST, as its load_inline would pick it: env_pool/build/cuda_arch.py).
    A solution whose import needs the device is imported again with it, holding the timing lane:
    nothing is timed while a candidate's code has the device outside its own run.
    """
    arch = ""
    if backend == "cuda":
        if cuda_arch.known() is None:
            async with ctx.timing_lane():  # once per worker: the probe makes a CUDA context on the device
                await asyncio.to_thread(cuda_arch.arch_list)
        arch = cuda_arch.arch_list()
    outcome = await _import_child(ctx, backend, scratch, gpu=backend == "cuda" and not arch, arch=arch)
    payload = _decode(outcome)
    if arch and not payload.get("ok") and cuda_arch.needs_device(f"{payload.get('error', '')}\n{outcome.output}"):
        async with ctx.timing_lane():
            outcome = await _import_child(ctx, backend, scratch, gpu=True)
        payload = _decode(outcome)
    return outcome, payload


async def _import_child(ctx, backend, scratch, gpu: bool, arch: str = "") -> SandboxOutcome:
    """The candidate's model_new.py imported once, sandboxed, under the compile limit; with the GPU or without."""
    cfg = ctx.cfg
    payload = {"role": "import", "backend": backend, "threads": cfg.threads, "light_header": bool(cfg.light_cuda_header),
               "fast_math": rules_named(cfg.rules).fast_math}
    own = split_cpus(int(cfg.threads)).builds  # off the servers' and the harness's CPUs: a build must not disturb a timed run
    limits = SandboxLimits(wall_s=cfg.compile_timeout_s, memory_mb=cfg.memory_limit_mb, use_gpu=gpu,
                           hidden_paths=ctx.private_paths, required_isolation=UNTRUSTED_ISOLATION, cpus=tuple(own))
    env = {"OMP_NUM_THREADS": str(cfg.threads), "TORCH_EXTENSIONS_DIR": str(scratch / EXTENSIONS),
           "TORCHINDUCTOR_CACHE_DIR": str(scratch / ".inductor"), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    if arch:
        env["TORCH_CUDA_ARCH_LIST"] = arch
    pch = inline_pch.ready_dir(Path(cfg.pch_dir), backend, own) if cfg.pch_dir else None
    if pch is not None:  # torch's headers precompiled: GCC looks on CPATH before torch's own include dirs
        env["CPATH"] = str(pch)
    return await asyncio.to_thread(_gated, ctx.gate, run_sandboxed, RUNNER, msgpack.packb(payload), scratch, limits, env)


def _gated(gate: BuildGate, build, *args, **kwargs):
    """``build(*args, **kwargs)`` in a worker thread, once no baselines are being timed on its CPUs."""
    with gate.build():
        return build(*args, **kwargs)


def _decode(outcome: SandboxOutcome) -> dict:
    try:
        decoded = msgpack.unpackb(outcome.result) if outcome.result else {}
    except Exception:  # a candidate that scribbled on the channel gets no benefit of the doubt
        return {}
    return decoded if isinstance(decoded, dict) else {}


def _judge(ctx, key, verdict: dict, result: EvalResult, timed: bool) -> None:
    """The harness's verdict (trusted) as an EvalResult."""
    result.run_log = str(verdict.get("run_log", ""))[-4000:]
    result.code_samples = verdict.get("code_samples") or {}
    result.warm_server = bool(verdict.get("warm_server"))
    result.checks = [InputCheck(**c) for c in verdict.get("checks", [])]
    result.violations = [Violation(**v) for v in verdict.get("violations", [])]
    if timed and verdict.get("in_turn") and verdict.get("eager") and verdict.get("compiled"):  # this evaluation's own
        base = Baseline(Timing(**verdict["eager"]), Timing(**verdict["compiled"]))
        result.timed_in_turn = True
    else:
        base = ctx.baselines.get(key) if timed else None
    if base is not None:  # the task's baselines stand whatever the candidate did (a sweep compares them)
        result.eager, result.compiled = base.eager, base.compiled
    if verdict.get("failure") and not result.violations:
        kind = verdict["failure"] if verdict["failure"] in FAILURE_KINDS else "crash"  # never an unknown kind
        return _set_failure(result, kind, verdict.get("message", ""))
    if result.violations:  # a guard's reason explains a failure best (an import it refused, say)
        return _set_failure(result, "guard", "rejected: " + "; ".join(f"[{v.guard}] {v.reason}" for v in result.violations))
    if not verdict.get("ok") or not result.checks:
        return _set_failure(result, "infra", "the harness returned no verdict")
    result.message = str(verdict.get("verification_note", ""))  # a task whose sets cannot tell a trivial kernel apart
    if timed:
        if base is None:
            return _set_failure(result, "infra", "no baseline timing for this task")
        if "candidate" not in verdict:  # correct, but too fast for the protocol to time: no speed milestone
            result.message = " ".join(filter(None, [result.message, str(verdict.get("timing_note", "the candidate's time could not be resolved"))]))
            return
        result.candidate = Timing(**verdict["candidate"])
        if verdict.get("eager_recheck"):  # env.eager_recheck
            result.eager_recheck = Timing(**verdict["eager_recheck"])


def _set_failure(result: EvalResult, kind: str, message: str) -> bool:
    result.failure, result.message = kind, message.strip()
    return False
