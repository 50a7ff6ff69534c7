"""Profile the native PyTorch reference for the agent: its eager time and where that time goes.

The paper's agent starts each task by profiling the reference model; the top operators say
what to fuse and which kernel matters. The reference is trusted code, but it still runs in a
child process under a time and memory limit (``run_sandboxed``), so a pathological task
(a huge preset, a hang in a library) costs one answer, never the worker. It holds the
device's timing lane like any timed run, and the answer is cached per task and backend.

Child entry point: ``python -m env_pool.reference_profile`` with a msgpack payload on stdin.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import sys
import uuid
from typing import Any

import msgpack

from env_pool.evaluate import EvalContext
from env_pool.isolation.sandbox import SandboxError, SandboxLimits, run_sandboxed
from tasks.task import Task

TOP_OPS = 8  # operators shown to the agent; the tail is rarely worth a kernel
PROFILED_RUNS = 3  # forward passes under torch.profiler: enough to average out one-off costs
MAX_REPETITIONS = 20  # the agent needs an estimate here, not the verifier's precision
COMMAND = [sys.executable, "-m", "env_pool.reference_profile"]


class ReferenceProfiles:
    """Profiles cached per (task id, backend); concurrent requests for one task share one run."""

    def __init__(self) -> None:
        self.cache: dict[tuple[str, str], dict[str, Any]] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    async def get(self, ctx: EvalContext, task: Task) -> dict[str, Any]:
        key = (task.id, _backend(ctx))
        async with self._locks.setdefault(key, asyncio.Lock()):
            if key not in self.cache:
                report = await profile_reference(ctx, task)
                if not report.get("ok"):
                    return report  # not cached: a failure may be the machine's, not the task's
                self.cache[key] = report
        return self.cache[key]


async def profile_reference(ctx: EvalContext, task: Task) -> dict[str, Any]:
    """Eager timing and top operators of the task's reference; {"ok": False, "error": ...} on failure."""
    backend = _backend(ctx)
    cfg = ctx.cfg
    payload = {"task": task.to_dict(), "backend": backend, "threads": cfg.threads, "warmup": cfg.warmup,
               "repetitions": min(cfg.repetitions, MAX_REPETITIONS), "top": TOP_OPS, "runs": PROFILED_RUNS}
    scratch = ctx.reference_dir / "profile" / uuid.uuid4().hex
    limits = SandboxLimits(wall_s=cfg.run_timeout_s, memory_mb=cfg.memory_limit_mb, use_gpu=backend == "cuda")
    env = {"OMP_NUM_THREADS": str(cfg.threads), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        scratch.mkdir(parents=True)
        async with ctx.lane:  # a timed run: it must not share the device with a candidate's timing
            outcome = await asyncio.to_thread(run_sandboxed, COMMAND, msgpack.packb(payload), scratch, limits, env)
    except (SandboxError, OSError) as err:
        return {"ok": False, "error": f"the environment failed: {type(err).__name__}: {err}"}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    try:
        report = msgpack.unpackb(outcome.result) if outcome.result else None
    except Exception:
        report = None
    if outcome.failure or not isinstance(report, dict):
        why = {"timeout": f"took longer than {cfg.run_timeout_s:g} s", "out_of_memory": "ran out of memory"}.get(
            outcome.failure or "", "crashed or returned nothing")
        return {"ok": False, "error": f"profiling the reference {why}\n{outcome.output[-1500:]}".strip()}
    return report


def _backend(ctx: EvalContext) -> str:
    return str(ctx.cfg.backend)


# ----------------------------------------------------------------------------- child side

def measure(payload: dict[str, Any]) -> dict[str, Any]:
    """In the child: build the reference, time it eagerly, and profile a few forward passes."""
    import torch

    from env_pool.shared.inputs import make_inputs, make_model
    from env_pool.shared.profile import time_callable
    from tasks.describe import describe_value
    from tasks.task import build_problem

    torch.set_num_threads(int(payload["threads"]))
    backend = payload["backend"]
    device = "cuda" if backend == "cuda" else "cpu"
    task = Task.from_dict(payload["task"])
    problem = build_problem(task, backend)
    model = make_model(problem, 0, device)
    inputs = make_inputs(problem, 1, device)
    eager = time_callable(model, [inputs], device, payload["warmup"], payload["repetitions"])
    top, total_ms = _top_operators(model, inputs, device, payload["runs"], payload["top"])
    return {
        "ok": True, "task_id": task.id, "backend": backend, "device": _device_name(device),
        "inputs": [describe_value(v) for v in inputs],
        "init_inputs": [describe_value(v) for v in problem.get_init_inputs()],
        "eager_ms": eager.median_ms, "eager_iqr_ms": eager.iqr_ms, "repetitions": eager.repetitions,
        "profiled_ms_per_run": total_ms, "top_ops": top,
    }


def _top_operators(model, inputs, device: str, runs: int, top: int) -> tuple[list[dict[str, Any]], float]:
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.no_grad():
        model(*inputs)  # one untraced pass: lazy initialisation is not the model's cost
        with profile(activities=activities) as prof:
            for _ in range(runs):
                model(*inputs)
            if device == "cuda":
                torch.cuda.synchronize()
    # On the GPU the device time is what a kernel replaces; on the CPU the operator's own time.
    # Only operator rows (CPU-side events) count: on the GPU each kernel also has a row of its
    # own, and its time is already its launching operator's self device time.
    field = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    events = [e for e in prof.key_averages()
              if getattr(e, field, 0) > 0 and getattr(e, "device_type", DeviceType.CPU) == DeviceType.CPU]
    total_us = sum(getattr(e, field) for e in events) or 1.0
    events.sort(key=lambda e: getattr(e, field), reverse=True)
    rows = [{"name": e.key, "self_pct": 100.0 * getattr(e, field) / total_us,
             "self_ms": getattr(e, field) / 1e3 / runs, "calls": e.count / runs} for e in events[:top]]
    return rows, total_us / 1e3 / runs


def _device_name(device: str) -> str:
    import platform

    import torch

    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"CPU ({platform.machine()}, {torch.get_num_threads()} thread(s))"


def main() -> None:
    from env_pool.isolation.result_channel import child_result_channel

    payload = msgpack.unpackb(sys.stdin.buffer.read())
    channel = child_result_channel()
    try:
        result = measure(payload)
    except Exception as err:
        result = {"ok": False, "error": f"{type(err).__name__}: {str(err)[:800]}"}
    channel.write(msgpack.packb(result))
    channel.flush()
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: profiler and CUDA shutdown can hang or be slow


if __name__ == "__main__":
    main()
