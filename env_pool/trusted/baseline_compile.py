"""Tasks' torch.compile baselines compiled ahead, into the inductor cache their trusted servers read.

TRUSTED SIDE: task references only, never a candidate's code. A task's first baselines are
timed in a trusted server (env_pool/candidate/serve.py) that compiles the reference in its build, while
the worker's timing lane waits: 5-60 s a task on the H100 host. A sweep over many tasks
compiles them here first, several processes at once off the lane, so each server's compile is
a cache hit (``python -m env_pool.trusted.baseline_compile``, jobs on stdin as msgpack, a JSON line per
task on stdout).

The compile is the server's own (serve.build_phase, the same torch settings and environment:
server_pool.compile_env), on inputs of the task's shapes, so the cache keys match. What it does
not keep is Triton's choice among a kernel's configurations (``*.best_config``): that choice
was benchmarked here beside other compiles, and is made again by the server, on a quiet device.
"""
from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

import msgpack
import torch

BEST_CONFIG = "*.best_config"  # Triton's autotuning choice, kept by inductor beside the kernel


def compile_ahead(job: dict) -> float:
    """Compile one task's baseline as its server would (job: task, backend, compile_mode, threads); seconds taken."""
    from env_pool.candidate import serve
    from tasks.task import build_problem

    payload = {**job, "init_seed": 0}
    task, device = serve.setup_torch(payload)
    problem = build_problem(task, payload["backend"])
    with torch.device(device):
        values = problem.get_inputs()
    # As the server's input slots hold them: contiguous, on the device, no autograd.
    args = [v.detach().to(device).contiguous() if isinstance(v, torch.Tensor) else v for v in values]
    begin = time.perf_counter()
    try:
        serve.build_phase("compiled", payload, problem, device, args, None, None, {})  # no layout or arena: nothing is served
    finally:
        del args
        torch._dynamo.reset()
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    return time.perf_counter() - begin


def forget_autotuning(inductor_dir: Path) -> int:
    """Remove the cache's Triton configuration choices (made beside other compiles); how many."""
    found = list(Path(inductor_dir).rglob(BEST_CONFIG))
    for path in found:
        path.unlink(missing_ok=True)
    return len(found)


def main() -> None:
    """Compile each job read from stdin (a msgpack list); one JSON line per job: id, ok, seconds, error."""
    for job in msgpack.unpackb(sys.stdin.buffer.read()):
        line = {"id": job["task"]["id"], "ok": False, "seconds": 0.0, "error": ""}
        try:
            line.update(ok=True, seconds=round(compile_ahead(job), 2))
        except Exception as err:  # noqa: BLE001  (one task's failure is its line; the next task goes on)
            line["error"] = f"{type(err).__name__}: {str(err)[:300]}"
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
