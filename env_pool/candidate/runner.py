"""Sandboxed child processes of the environment other than the round servers: ``python -m env_pool.candidate.runner``.

Roles (payload on stdin, or ``--payload FILE`` under a profiler):
- ``import``: imports the candidate's ``model_new.py`` once, so that a KernelBench-style
  ``load_inline`` build happens under the compile time limit and lands in the cache.
- ``ncu``: one forward call of the candidate under Nsight Compute (informational, never rewarded).

Verification and timing are not here: the trusted harness (env_pool/trusted/harness.py) drives a
server (env_pool/candidate/serve.py) for those. Everything reported goes on the result channel as
msgpack and is untrusted; the candidate's own prints go to stdout/stderr.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import msgpack
import torch

from env_pool.build import nvcc_light

from env_pool.candidate import guards
from env_pool.candidate.serve import copy_matching_weights, load_solution, setup_torch, short_error, use_prebuilt_extensions
from env_pool.isolation.result_channel import child_exit, child_result_channel
from env_pool.shared.inputs import build_on, make_inputs, make_model
from env_pool.shared.profile import synchronize
from tasks.task import build_problem


def run_import(payload: dict) -> dict:
    torch.set_num_threads(int(payload.get("threads", 1)))
    if payload.get("backend") == "cuda" and payload.get("light_header", False):
        nvcc_light.use_in_torch(Path.cwd() / ".nvcc-view")
    module = load_solution(Path.cwd(), payload["backend"], bool(payload.get("fast_math", False)))
    if not hasattr(module, "ModelNew"):
        return {"ok": False, "stage": "import", "error": "model_new.py does not define ModelNew"}
    return {"ok": True}


def run_ncu(payload: dict) -> dict:
    """Under ncu (``--profile-from-start off``): a warm-up call, then one forward call between
    cudaProfilerStart and cudaProfilerStop, so that only the candidate's forward is profiled.

    The guards are armed as for a verification run (no reference, no environment, no writes
    outside the folder); the seccomp filter is not installed: ncu's injected library runs in
    this process and its needs are ncu's business. The run is informational, never rewarded.
    """
    task, device = setup_torch(payload)
    scratch = Path.cwd()
    problem = build_problem(task, payload["backend"])
    reference = make_model(problem, payload["init_seed"], device)
    state_dict = {k: v.clone() for k, v in reference.state_dict().items()}
    inputs = make_inputs(problem, payload["init_seed"], device)
    del reference
    use_prebuilt_extensions()
    state = guards.install(scratch)
    guards.forget_environment_modules()
    state.armed = True
    module = load_solution(scratch, payload["backend"])
    torch.manual_seed(payload["init_seed"])
    model = build_on(device, module.ModelNew, problem.get_init_inputs())
    copy_matching_weights(model, state_dict)
    with torch.no_grad():
        model(*inputs)
        synchronize(device)
        torch.cuda.profiler.start()
        model(*inputs)
        synchronize(device)
        torch.cuda.profiler.stop()
    return {"ok": True, "violations": [v.__dict__ for v in state.violations]}


ROLES = {"import": run_import, "ncu": run_ncu}


def main() -> None:
    if sys.argv[1:2] == ["--payload"]:
        # Started by a profiler, which need not pass our stdin or the result channel's fd through:
        # the payload is a file, and the outcome goes to stderr (the profiler's report is the result).
        payload, channel = msgpack.unpackb(Path(sys.argv[2]).read_bytes()), None
    else:
        payload = msgpack.unpackb(sys.stdin.buffer.read())
        channel = child_result_channel()  # opened before any candidate code runs
    try:
        result = ROLES[payload["role"]](payload)
    except Exception as err:
        result = {"ok": False, "stage": "runner", "error": short_error(err), "violations": []}
    if channel is None:
        print(f"cuda-agent runner: {result}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0 if result.get("ok") else 1)
    child_exit(channel, msgpack.packb(result))


if __name__ == "__main__":
    main()
