"""The child process of an evaluation: ``python -m env_pool.runner``, payload on stdin.

Roles:
- ``reference`` (trusted code only): builds the task's inputs from the seeds, writes the
  expected outputs to the environment's private folder, and times the eager and
  torch.compile baselines when asked.
- ``import``: imports the candidate's ``model_new.py`` once, so that a KernelBench-style
  ``load_inline`` build happens under the compile time limit and lands in the cache.
- ``candidate``: times the eager reference (before any candidate code is loaded), then arms
  the guards, imports ``ModelNew``, runs it on the verification inputs under the torch-op
  detector, writes its outputs for the trusted verifier, and times it.

Everything it reports goes on the result channel as msgpack; the candidate's own prints go
to stdout/stderr, which the sandbox trims.
"""
from __future__ import annotations

import gc
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import msgpack
import torch

from env_pool import guards, seccomp
from env_pool.inputs import adversarial, make_inputs, make_model
from env_pool.profile import CacheFlusher, synchronize, time_callable
from env_pool.sandbox import child_result_channel
from tasks.task import Task, build_problem

SOLUTION_MODULE = "model_new"


def _outputs(model: Any, inputs: list[object]) -> list[torch.Tensor]:
    out = model(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _setup(payload: dict) -> tuple[Task, str]:
    torch.set_num_threads(int(payload.get("threads", 1)))
    # Full float32 on the GPU: TF32 convolutions and matmuls miss a 1e-4 tolerance by 4-77x,
    # which would fail correct float32 kernels against the reference.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return Task.from_dict(payload["task"]), "cuda" if payload["backend"] == "cuda" else "cpu"


def _verify_input_sets(problem, payload: dict, device: str) -> list[list[object]]:
    sets = [make_inputs(problem, seed, device) for seed in payload["verify_seeds"]]
    if payload.get("adversarial"):
        sets += adversarial(sets[0], payload["verify_seeds"][0])
    return sets


def run_reference(payload: dict) -> dict:
    task, device = _setup(payload)
    problem = build_problem(task, payload["backend"])
    model = make_model(problem, payload["init_seed"], device)
    input_sets = _verify_input_sets(problem, payload, device)
    if payload.get("profile_seeds"):  # the output of the last timing input set checks the timed run
        input_sets.append(make_inputs(problem, payload["profile_seeds"][-1], device))
    with torch.no_grad():
        expected = [[o.detach().cpu() for o in _outputs(model, inputs)] for inputs in input_sets]
    torch.save(expected, payload["expected_path"])
    result: dict[str, Any] = {"ok": True}
    if payload.get("baseline"):
        base = payload["baseline"]
        profile_sets = [make_inputs(problem, s, device) for s in payload["profile_seeds"]]
        flusher = CacheFlusher(device)
        eager = time_callable(model, profile_sets, device, base["warmup"], base["repetitions"], flusher)
        compiled_model = torch.compile(model, mode=None if base["compile_mode"] == "default" else base["compile_mode"])
        compiled = time_callable(compiled_model, profile_sets, device, base["warmup"], base["repetitions"], flusher)
        result["eager"], result["compiled"] = eager.__dict__, compiled.__dict__
    return result


def _load_solution(scratch: Path) -> Any:
    # Last on the path (the runner starts with -P): the solution may import its own helper
    # modules, but none of them can shadow an installed one.
    if str(scratch) not in sys.path:
        sys.path.append(str(scratch))
    spec = importlib.util.spec_from_file_location(SOLUTION_MODULE, scratch / f"{SOLUTION_MODULE}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[SOLUTION_MODULE] = module
    spec.loader.exec_module(module)
    return module


def run_import(payload: dict) -> dict:
    torch.set_num_threads(int(payload.get("threads", 1)))
    module = _load_solution(Path.cwd())
    if not hasattr(module, "ModelNew"):
        return {"ok": False, "stage": "import", "error": "model_new.py does not define ModelNew"}
    return {"ok": True}


def run_candidate(payload: dict) -> dict:
    task, device = _setup(payload)
    scratch = Path.cwd()
    problem = build_problem(task, payload["backend"])
    reference = make_model(problem, payload["init_seed"], device)
    state_dict = {k: v.clone() for k, v in reference.state_dict().items()}
    init_inputs = problem.get_init_inputs()
    verify_sets = _verify_input_sets(problem, payload, device)
    prof = payload.get("profile")
    flusher = CacheFlusher(device) if prof else None
    if prof:
        profile_sets = [make_inputs(problem, s, device) for s in payload["profile_seeds"]]
        # Packed to bytes at once: nothing the candidate can reach later holds a mutable timing.
        eager = msgpack.packb(time_callable(reference, profile_sets, device, prof["warmup"], prof["repetitions"], flusher).__dict__)
    del reference
    _poison_freed_memory(device)
    _use_prebuilt_extensions()
    if payload.get("seccomp", True):
        try:
            seccomp.forbid_processes()
        except OSError as err:  # the environment's fault: reported as infra, never as the candidate's
            return {"ok": False, "stage": "seccomp", "error": f"could not install the seccomp filter: {err}", "violations": []}

    state = guards.install(scratch)
    watched = guards.snapshot_watched()
    threads = guards.live_threads()
    guards.forget_environment_modules()
    state.armed = True
    result: dict[str, Any] = {"ok": False, "violations": []}
    try:
        module = _load_solution(scratch)
    except Exception as err:
        return _finish(result, state, watched, stage="import", error=_short_error(err))
    if not hasattr(module, "ModelNew"):
        return _finish(result, state, watched, stage="import", error="model_new.py does not define ModelNew")
    try:
        torch.manual_seed(payload["init_seed"])
        model = module.ModelNew(*init_inputs).to(device).eval()
        _copy_matching_weights(model, state_dict)
        outputs, meta, mutated = [], [], False
        for inputs in verify_sets:
            before = [v.clone() if isinstance(v, torch.Tensor) else v for v in inputs]
            with torch.no_grad(), guards.FallbackDetector(state):
                out = _outputs(model, inputs)
            synchronize(device)
            guards.check_threads(state, threads)
            mutated |= any(isinstance(b, torch.Tensor) and not torch.equal(b, v) for b, v in zip(before, inputs))
            _record(out, device, outputs, meta)
        if mutated:
            state.flag("input_mutation", "ModelNew.forward changed its inputs in place")
        if prof and not state.violations:
            streams: dict[str, Any] = {}
            result["candidate"] = time_callable(model, profile_sets, device, prof["warmup"], prof["repetitions"], flusher, streams).__dict__
            if streams.get("escaped"):
                state.flag("stream", f"work outside the current stream kept the GPU busy ({streams['device_ms']:.3f} ms per call, "
                                     f"the current stream {streams['event_ms']:.3f} ms): join side streams to the current stream "
                                     "before forward returns, or the caller reads unfinished outputs")
            result["eager"] = msgpack.unpackb(eager)
            with torch.no_grad():  # the last timed input set's output is checked too: no fast path only when timed
                out = _outputs(model, profile_sets[-1])
            synchronize(device)
            _record(out, device, outputs, meta)
            guards.check_threads(state, threads)
        torch.save({"outputs": outputs, "meta": meta}, scratch / "outputs.pt")
    except Exception as err:
        return _finish(result, state, watched, stage="run", error=_short_error(err))
    result["ok"] = True
    return _finish(result, state, watched, stage="done")


def _use_prebuilt_extensions() -> None:
    """Make load_inline load what the import step built, without running ninja or a compiler.

    In a fresh process load_inline always calls its build function (its version table lives in
    memory), which starts ninja and queries the compiler: processes, which the candidate's
    process may not start. The build already happened in the import child, under the compile
    time limit, in the same TORCH_EXTENSIONS_DIR; here only its library is loaded.
    """
    from torch.utils import cpp_extension

    def load_prebuilt(name: str, build_directory: str, **_: Any) -> None:
        if not os.path.exists(os.path.join(build_directory, f"{name}{cpp_extension.LIB_EXT}")):
            raise RuntimeError(f"extension {name!r} was not built by the compile step: its sources changed between the "
                               "compile step and the run (load_inline sources must not depend on run-time state)")

    cpp_extension._write_ninja_file_and_build_library = load_prebuilt


def run_ncu(payload: dict) -> dict:
    """Under ncu (``--profile-from-start off``): a warm-up call, then one forward call between
    cudaProfilerStart and cudaProfilerStop, so that only the candidate's forward is profiled.

    The guards are armed as for a verification run (no reference, no environment, no writes
    outside the folder); the seccomp filter is not installed: ncu's injected library runs in
    this process and its needs are ncu's business. The run is informational, never rewarded.
    """
    task, device = _setup(payload)
    scratch = Path.cwd()
    problem = build_problem(task, payload["backend"])
    reference = make_model(problem, payload["init_seed"], device)
    state_dict = {k: v.clone() for k, v in reference.state_dict().items()}
    inputs = make_inputs(problem, payload["init_seed"], device)
    del reference
    _use_prebuilt_extensions()
    state = guards.install(scratch)
    guards.forget_environment_modules()
    state.armed = True
    module = _load_solution(scratch)
    torch.manual_seed(payload["init_seed"])
    model = module.ModelNew(*problem.get_init_inputs()).to(device).eval()
    _copy_matching_weights(model, state_dict)
    with torch.no_grad():
        model(*inputs)
        synchronize(device)
        torch.cuda.profiler.start()
        model(*inputs)
        synchronize(device)
        torch.cuda.profiler.stop()
    return {"ok": True, "violations": [v.__dict__ for v in state.violations]}


def _record(out: list[torch.Tensor], device: str, outputs: list, meta: list) -> None:
    # Copied now: a native thread still writing after forward returned must not get a late pass.
    outputs.append([o.detach().to("cpu", copy=True) for o in out])
    meta.append([{"device_type": o.device.type, "expected_device_type": device, "contiguous": o.is_contiguous()} for o in out])


def _finish(result: dict, state: guards.GuardState, watched: dict, stage: str, error: str = "") -> dict:
    state.armed = False
    guards.check_tamper(state, watched)
    result.update(stage=stage, error=error, violations=[v.__dict__ for v in state.violations])
    return result


def _copy_matching_weights(model: torch.nn.Module, reference_state: dict[str, torch.Tensor]) -> None:
    own = model.state_dict()
    matching = {k: v for k, v in reference_state.items() if k in own and own[k].shape == v.shape}
    model.load_state_dict(matching, strict=False)


def _poison_freed_memory(device: str) -> None:
    """Fill memory the reference freed with NaN, so a candidate returning uninitialised buffers cannot pass."""
    gc.collect()
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        poison = torch.empty(int(free * 0.5) // 4, dtype=torch.float32, device="cuda").fill_(float("nan"))
        del poison
    else:
        for size in (2**16, 2**20, 2**22):  # below and above glibc's mmap threshold
            blocks = [torch.full((size,), float("nan")) for _ in range(8)]
            del blocks


def _short_error(err: BaseException) -> str:
    # lookup_lines=False: reading source files here would trip the armed filesystem guard.
    frames = traceback.StackSummary.extract(traceback.walk_tb(err.__traceback__), lookup_lines=False)
    where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames) if SOLUTION_MODULE in f.filename or "kernel" in f.filename), "")
    return f"{type(err).__name__}: {str(err).strip()[:800]}" + (f" (at {where})" if where else "")


ROLES = {"reference": run_reference, "import": run_import, "candidate": run_candidate, "ncu": run_ncu}


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
        result = {"ok": False, "stage": "runner", "error": _short_error(err), "violations": []}
    if channel is None:
        print(f"cuda-agent runner: {result}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0 if result.get("ok") else 1)
    channel.write(msgpack.packb(result))
    channel.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip atexit and finalizers: nothing the candidate registered runs after the result


if __name__ == "__main__":
    main()
