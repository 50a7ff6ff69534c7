"""One evaluation of one candidate: compile, reference, candidate run, verification, timing, reward.

The steps, and why they are split the way they are:
1. compile: the fast path (kernel.cpp / kernel.cu, no torch headers) in a compiler
   subprocess, or, for a KernelBench-style solution, an import under the compile time limit
   that runs its load_inline build.
2. reference (trusted process): builds the verification inputs from fresh secret seeds and
   writes the expected outputs to a private folder that the candidate's process cannot see.
   It also times the eager and torch.compile baselines, once per task per worker.
3. candidate (sandboxed process, holding the device's timing lane): runs ModelNew under the
   guards on the same inputs, writes its outputs, and is timed beside the eager reference.
4. verification here, in the caller's process, where no candidate code has run.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import msgpack
import torch

from env_pool.compile import BACKENDS, compile_kernel
from env_pool.results import EvalResult, Timing, Violation
from env_pool.reward import apply_reward
from env_pool.sandbox import SandboxError, SandboxLimits, SandboxOutcome, run_sandboxed
from env_pool.seccomp import KILL_SIGNAL
from env_pool.verify import check_outputs, varies_with_inputs
from tasks.task import Task

SOLUTION_FILE = "model_new.py"
# -P: the scratch folder (the cwd) is not put first on sys.path, so a candidate's msgpack.py or
# torch.py cannot replace what the runner imports before its guards are armed.
RUNNER = [sys.executable, "-P", "-m", "env_pool.runner"]
MODES = ("compile", "verify", "full")  # full = verify + profile
CANDIDATE_ISOLATION = ("pidns", "mountns", "no-caps", "netns")
# How allocators report failure when they raise instead of dying: torch on CPU and GPU, C++.
OOM_SIGNS = ("can't allocate memory", "CUDA out of memory", "OutOfMemoryError", "bad_alloc", "MemoryError")


@dataclass
class Baseline:
    """Eager and torch.compile timings of a task's reference, measured once per worker."""

    eager: Timing
    compiled: Timing


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
    def reference_dir(self) -> Path:
        """The trusted side's folder: expected outputs and the inductor cache. Hidden from candidates."""
        return self.work_dir / "reference"


async def evaluate(ctx: EvalContext, task: Task, files: Mapping[str, str], mode: str = "full") -> EvalResult:
    """Evaluate a candidate's files on a task; never raises for anything the candidate did."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    start = time.perf_counter()
    backend = str(getattr(ctx.cfg.backend, "value", ctx.cfg.backend))
    result = EvalResult(task_id=task.id, backend=backend)
    scratch = ctx.work_dir / "scratch" / uuid.uuid4().hex
    private = ctx.reference_dir / "private" / uuid.uuid4().hex
    try:
        scratch.mkdir(parents=True)
        private.mkdir(parents=True, mode=0o700)
        await _run_steps(ctx, task, dict(files), mode, backend, scratch, private, result)
    except WorkerUnhealthy as err:
        _set_failure(result, "infra", f"this worker's device is unhealthy ({err}); retry the evaluation on another worker")
    except (SandboxError, OSError) as err:  # the environment's own fault: the pool retries it once
        _set_failure(result, "infra", f"the environment failed: {type(err).__name__}: {err}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)
    result.wall_s = time.perf_counter() - start
    # One rule for every mode: a failure or an unchecked result is FAIL; without timings, CORRECT at most.
    return apply_reward(result, ctx.cfg.reward)


async def _run_steps(ctx, task, files, mode, backend, scratch, private, result) -> None:
    if SOLUTION_FILE not in files:
        return _set_failure(result, "missing_files", f"{SOLUTION_FILE} is missing: it must define class ModelNew")
    for name, text in files.items():
        if "/" in name or name.startswith(".") or not name.endswith((".py", ".cpp", ".cu", ".h", ".hpp", ".cuh")):
            continue  # the compile step validates kernel names; other files are the agent's notes
        (scratch / name).write_text(text)
    if not await _compile_step(ctx, files, backend, scratch, result) or mode == "compile":
        return
    seeds = _fresh_seeds(ctx.cfg.correctness_inputs)
    if not await _reference_step(ctx, task, backend, seeds, private, result, baseline=mode == "full"):
        return
    async with ctx.timing_lane():
        outcome = await _child(ctx, "candidate", task, backend, seeds, scratch, [ctx.reference_dir], ctx.cfg.run_timeout_s,
                               profile=mode == "full")
        if outcome.timed_out and ctx.after_timeout is not None:
            await ctx.after_timeout()  # before the lane is released: the next run must not start on a hung device
    _judge(ctx, task, outcome, scratch, private, result, profiled=mode == "full")


async def _compile_step(ctx, files, backend, scratch, result) -> bool:
    spec = BACKENDS[backend]
    if spec.source in files:
        built = await asyncio.to_thread(compile_kernel, files, backend, ctx.work_dir / "kernels", ctx.cfg.compile_timeout_s)
        result.compile_s, result.cache_hit, result.compile_log = built.seconds, built.cache_hit, built.log
        if not built.ok:
            return _set_failure(result, "infra" if built.infra else "compile_error", "compile failed:\n" + built.log)
        shutil.copyfile(built.library, scratch / "kernel.so")
        return True
    if "cpp_extension" not in files[SOLUTION_FILE]:
        return True  # plain Python: the candidate's own run imports it
    # KernelBench path: importing model_new.py runs its load_inline build, under the compile limit.
    begin = time.perf_counter()
    outcome = await _child(ctx, "import", None, backend, None, scratch, [], ctx.cfg.compile_timeout_s)
    result.compile_s = time.perf_counter() - begin
    payload = _decode(outcome)
    if outcome.failure or not payload.get("ok"):
        result.compile_log = (payload.get("error") or "") + "\n" + outcome.output[-3000:]
        kind = "timeout" if outcome.timed_out else "compile_error"
        return _set_failure(result, kind, f"importing {SOLUTION_FILE} failed: {payload.get('error') or outcome.failure}")
    return True


async def _reference_step(ctx, task, backend, seeds, private, result, baseline: bool) -> bool:
    key = (task.id, backend)
    want_baseline = baseline and key not in ctx.baselines
    if want_baseline:
        async with ctx.timing_lane():  # the baselines are timed runs too; torch.compile may take minutes cold
            outcome = await _child(ctx, "reference", task, backend, seeds, ctx.reference_dir, [],
                                   ctx.cfg.run_timeout_s + ctx.cfg.compile_timeout_s, private=private, baseline=True)
    else:
        outcome = await _child(ctx, "reference", task, backend, seeds, ctx.reference_dir, [], ctx.cfg.run_timeout_s, private=private)
    payload = _decode(outcome)
    if outcome.failure or not payload.get("ok"):
        detail = payload.get("error") or outcome.failure or "no result"
        return _set_failure(result, "infra", f"the reference failed to run: {detail}\n{outcome.output[-2000:]}")
    if want_baseline:
        ctx.baselines[key] = Baseline(Timing(**payload["eager"]), Timing(**payload["compiled"]))
    return True


def _fresh_seeds(n: int) -> dict[str, Any]:
    draw = lambda: secrets.randbits(62)  # noqa: E731 - fresh per evaluation, never written to disk
    return {"init_seed": draw(), "verify_seeds": [draw() for _ in range(n)], "profile_seeds": [draw() for _ in range(3)]}


async def _child(ctx, role, task, backend, seeds, cwd, hidden, timeout_s, private=None, baseline=False, profile=False) -> SandboxOutcome:
    cfg = ctx.cfg
    payload: dict[str, Any] = {"role": role, "backend": backend, "threads": cfg.threads, "adversarial": bool(cfg.adversarial_inputs)}
    if task is not None:
        payload["task"] = task.to_dict()
    if seeds is not None:
        payload.update(seeds)
    if private is not None:
        payload["expected_path"] = str(private / "expected.pt")
    if baseline:
        payload["baseline"] = {"warmup": cfg.warmup, "repetitions": cfg.repetitions, "compile_mode": cfg.compile_mode}
    if profile:
        payload["profile"] = {"warmup": cfg.warmup, "repetitions": cfg.repetitions}
    if role == "candidate":
        payload["seccomp"] = bool(cfg.seccomp)
    limits = SandboxLimits(wall_s=timeout_s, memory_mb=cfg.memory_limit_mb, use_gpu=backend == "cuda",
                           allow_network=role == "reference", hidden_paths=list(hidden),
                           # Without these a root candidate could kill the worker or unhide the verifier's data.
                           required_isolation=() if role == "reference" else CANDIDATE_ISOLATION)
    env = {"OMP_NUM_THREADS": str(cfg.threads), "TORCH_EXTENSIONS_DIR": str(cwd / ".torch_extensions"),
           # The reference's compiled baselines are cached in the hidden folder; a candidate that
           # touches torch._dynamo (the guards' dispatch mode imports it) gets its own, in scratch.
           "TORCHINDUCTOR_CACHE_DIR": str(ctx.reference_dir / "inductor" if role == "reference" else cwd / ".inductor"),
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return await asyncio.to_thread(run_sandboxed, RUNNER, msgpack.packb(payload), cwd, limits, env)


def _decode(outcome: SandboxOutcome) -> dict:
    try:
        return msgpack.unpackb(outcome.result) if outcome.result else {}
    except Exception:  # a candidate that scribbled on the channel gets no benefit of the doubt
        return {}


def _judge(ctx, task, outcome: SandboxOutcome, scratch: Path, private: Path, result: EvalResult, profiled: bool) -> None:
    payload = _decode(outcome)
    result.run_log = outcome.output[-4000:]
    result.violations = [Violation(**v) for v in payload.get("violations", [])]
    if outcome.signal_name == KILL_SIGNAL and ctx.cfg.seccomp:
        result.violations.append(Violation("subprocess", "tried to start a process or run a program from native code "
                                           "(fork, exec or system()): the seccomp filter killed it with SIGSYS"))
        return _set_failure(result, "guard", "rejected: [subprocess] " + result.violations[-1].reason)
    if payload.get("stage") == "seccomp":
        return _set_failure(result, "infra", payload.get("error") or "the seccomp filter could not be installed")
    if outcome.failure:
        what = {"timeout": f"exceeded the {ctx.cfg.run_timeout_s:g} s time limit", "out_of_memory": "exceeded the memory limit",
                "crash": f"crashed ({outcome.signal_name or 'exit code ' + str(outcome.returncode)})"}[outcome.failure]
        return _set_failure(result, outcome.failure, f"the candidate {what}\n{outcome.output[-1500:]}")
    if result.violations:
        return _set_failure(result, "guard", "rejected: " + "; ".join(f"[{v.guard}] {v.reason}" for v in result.violations))
    if not payload.get("ok"):
        kind = "compile_error" if payload.get("stage") == "import" else "crash"
        if any(sign in (payload.get("error") or "") for sign in OOM_SIGNS):
            kind = "out_of_memory"
        return _set_failure(result, kind, f"ModelNew failed ({payload.get('stage')}): {payload.get('error')}")
    _verify(task, scratch, private, result)
    if result.failure is None and profiled:
        _timings(ctx, task, payload, result)


def _verify(task: Task, scratch: Path, private: Path, result: EvalResult) -> None:
    try:
        expected = torch.load(private / "expected.pt")
        got = torch.load(scratch / "outputs.pt", weights_only=True)
    except Exception as err:
        return _set_failure(result, "wrong", f"the candidate's outputs could not be read: {type(err).__name__}")
    outputs, meta = got.get("outputs", []), got.get("meta", [])
    n = min(len(outputs), len(expected))
    result.checks = [check_outputs(i, task, expected[i], outputs[i], meta[i]) for i in range(n)]
    if n < len(expected) - 1:  # the last expected set is the timed run's, absent in verify mode
        return _set_failure(result, "wrong", f"outputs for {n} of {len(expected)} input sets")
    failed = [c for c in result.checks if not c.passed]
    if failed:
        return _set_failure(result, "wrong", f"wrong on input set {failed[0].index}: {failed[0].reason}")
    if varies_with_inputs(expected[:n]) and not varies_with_inputs(outputs[:n]):
        return _set_failure(result, "wrong", "the output does not change with the inputs")


def _timings(ctx: EvalContext, task: Task, payload: dict, result: EvalResult) -> None:
    base = ctx.baselines[(task.id, result.backend)]
    result.candidate = Timing(**payload["candidate"])
    result.eager = Timing(**payload["eager"])
    # torch.compile is timed once per worker; scale it by this run's eager drift so that a
    # busier or quieter machine moves both baselines together.
    drift = result.eager.median_ms / base.eager.median_ms
    result.compiled = Timing(base.compiled.median_ms * drift, base.compiled.iqr_ms * drift, base.compiled.repetitions)


def _set_failure(result: EvalResult, kind: str, message: str) -> bool:
    result.failure, result.message = kind, message.strip()
    return False
