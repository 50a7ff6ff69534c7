"""The environment's integrity on a GPU: the corpus's cuda verdicts and the timing's fidelity.

    python scripts/bench_integrity.py --out DIR [--repeats 5] [--skip-corpus] [--skip-fidelity] [--env KEY=VALUE ...]

Needs only torch (and triton for do_bench) beside the sources: the environment runs in this
process as an EnvWorker would run it (no Ray). Writes DIR/integrity.json and each worker's harness
log (DIR/harness-*.log: per phase, the rounds and the harness's share of them), and prints a table.

1. Corpus: every case of tests/env_corpus whose backend is cuda, evaluated in its mode; its
   verdict against case.json (the gpu-marked corpus tests check the same through pytest).
2. Fidelity: each legitimate cuda kernel evaluated ``--repeats`` times in separate evaluations
   on one worker (the worker's baselines are measured once, as in training): the spread of
   its speedup over eager. Then the same kernel and reference, on inputs made the same way,
   timed independently in this process by triton.testing.do_bench and by KernelBench's own
   loop (a CUDA event pair around each call, a synchronisation after it, 100 trials, no cache
   flush: its eval.py's time_execution_with_cuda_event): the environment's speedup against
   theirs. A benchmark measures; nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from enum import Enum
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from configs import schema  # noqa: E402
from configs.schema import EnvConfig  # noqa: E402
from env_pool.build.compile import compile_kernel  # noqa: E402
from env_pool.evaluate import EvalContext, evaluate  # noqa: E402
from tasks.loader import load_tasks  # noqa: E402
from tasks.solution import write_solution  # noqa: E402
from tasks.task import build_problem  # noqa: E402
from tests.corpus_cases import files_of, load_cases, meets, verdicts  # noqa: E402


CORPUS_SETTINGS = {"repetitions": 5, "warmup": 1, "run_timeout_s": 60.0, "compile_timeout_s": 300.0, "memory_limit_mb": 16384}


def context(work: Path, **overrides) -> EvalContext:
    cfg = EnvConfig(**{"work_dir": str(work), **overrides})
    cfg.backend = "cuda"
    return EvalContext(cfg=cfg)


def run_corpus(work: Path, tasks: dict, only: list[str]) -> list[dict]:
    ctx = context(work / "corpus", **CORPUS_SETTINGS)
    rows = []
    for kind in ("legit", "hacks"):
        for folder, case in load_cases(kind):
            if case["backend"] != "cuda" or (only and folder.name not in only):
                continue
            begin = time.perf_counter()
            if case.get("settings"):  # one harness on the device at a time: each keeps its tasks' slots there
                ctx.close()  # (its next evaluation starts another)
            own = context(work / "corpus", **{**CORPUS_SETTINGS, **case["settings"]}) if case.get("settings") else ctx
            try:
                result = asyncio.run(evaluate(own, tasks[case["task"]], files_of(folder), case.get("mode", "verify")))
            finally:
                if own is not ctx:
                    own.close()
            ok = any(meets(result, v) for v in verdicts(case))
            rows.append({"case": f"{kind}/{folder.name}", "expect": case["expect"], "hard": bool(case.get("hard")),
                         "failure": result.failure, "milestone": int(result.milestone),
                         "guards": sorted({v.guard for v in result.violations}), "ok": ok,
                         "message": result.message[:300], "wall_s": round(time.perf_counter() - begin, 1),
                         "code_samples": result.code_samples})
            print(f"{'OK ' if ok else 'BAD'} {kind}/{folder.name}: {result.failure} m={int(result.milestone)} "
                  f"{rows[-1]['guards']} {result.message[:120]!r} samples {result.code_samples.get('samples')}", flush=True)
    return rows


def env_speedups(work: Path, task, files: dict, repeats: int, env: dict) -> list[dict]:
    """``repeats`` full evaluations in one environment (the task's baselines timed once, then cached)."""
    ctx = context(work / "fidelity", **env)
    out = []
    for _ in range(repeats):
        result = asyncio.run(evaluate(ctx, task, files, "full"))
        times = " ".join(f"{name} {t.median_ms:.4f} ms" for name, t in
                         (("candidate", result.candidate), ("eager", result.eager), ("compiled", result.compiled)) if t)
        print(f"  {task.id}: {result.failure} {result.message[:200]!r} speedup {result.speedup_vs_eager} "
              f"({times}; {result.wall_s:.1f} s)", flush=True)  # which side moved, when the speedup disagrees with do_bench
        out.append({"failure": result.failure, "speedup": result.speedup_vs_eager, "wall_s": round(result.wall_s, 2),
                    "milestone": int(result.milestone), "eager_interval": result.eager_interval,
                    "compile_interval": result.compile_interval,
                    "eager_recheck_ms": result.eager_recheck.median_ms if result.eager_recheck else None,
                    "candidate_ms": result.candidate.median_ms if result.candidate else None,
                    "eager_ms": result.eager.median_ms if result.eager else None,
                    "compiled_ms": result.compiled.median_ms if result.compiled else None})
    return out


def candidate_module(files: dict, work: Path):
    """The solution's model_new module, built and imported in this process (outside any sandbox)."""
    built = compile_kernel(files, "cuda", work / "kernels")
    folder = Path(tempfile.mkdtemp(dir=work))
    write_solution(folder, files)  # a load_inline or paper-layout solution builds itself on import: no kernel.so
    if built.library:
        (folder / "kernel.so").write_bytes(Path(built.library).read_bytes())
    spec = importlib.util.spec_from_file_location(f"model_new_{folder.name}", folder / "model_new.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def independent(task, files: dict, work: Path) -> dict:
    """Eager and candidate timed here, on one input set, by do_bench and by KernelBench's loop."""
    import triton.testing

    module = candidate_module(files, work)
    problem = build_problem(task, "cuda")
    torch.manual_seed(0)
    ref = problem.model_cls(*problem.get_init_inputs()).cuda().eval()
    torch.manual_seed(0)
    new = module.ModelNew(*problem.get_init_inputs()).cuda().eval()
    own = new.state_dict()
    new.load_state_dict({k: v for k, v in ref.state_dict().items() if k in own and own[k].shape == v.shape}, strict=False)
    torch.manual_seed(1)
    with torch.device("cuda"):
        inputs = [v.cuda() if isinstance(v, torch.Tensor) else v for v in problem.get_inputs()]
    with torch.no_grad():
        times = {name: (triton.testing.do_bench(lambda m=m: m(*inputs), warmup=25, rep=100), _kernelbench_ms(m, inputs))
                 for name, m in (("eager", ref), ("candidate", new))}
    return {"do_bench": times["eager"][0] / times["candidate"][0], "kernelbench": times["eager"][1] / times["candidate"][1],
            "do_bench_ms": {k: v[0] for k, v in times.items()}, "kernelbench_ms": {k: v[1] for k, v in times.items()}}


def _kernelbench_ms(model, inputs, trials: int = 100) -> float:
    for _ in range(3):
        model(*inputs)
    torch.cuda.synchronize()
    samples = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        model(*inputs)
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.mean(samples)


def run_fidelity(work: Path, tasks: dict, repeats: int, only: list[str], rows: list[dict],
                 save: Callable[[], None], env: dict) -> None:
    """Appends each kernel's row to ``rows`` and saves as it goes: a lease's call cut short keeps what ran."""
    for folder, case in load_cases("legit"):
        if case["backend"] != "cuda" or (only and folder.name not in only):
            continue
        task, files = tasks[case["task"]], files_of(folder)
        # The case's own settings first (linear_relu_cublas_paper_cuda's paper rules, without which its
        # cuBLAS call is a library fallback), then --env's.
        evals = env_speedups(work, task, files, repeats, {**case.get("settings", {}), **env})
        speeds = [e["speedup"] for e in evals if e["speedup"]]
        ind = independent(task, files, work)
        row = {"kernel": folder.name, "env": evals, "independent": ind}
        if speeds:
            mid = statistics.median(speeds)
            row.update(median=mid, spread=(max(speeds) - min(speeds)) / mid,
                       vs_do_bench=mid / ind["do_bench"] - 1, vs_kernelbench=mid / ind["kernelbench"] - 1)
        rows.append(row)
        save()
        print(json.dumps({k: v for k, v in row.items() if k != "env"}, default=str), flush=True)


def keep_harness_logs(work: Path, out: Path) -> None:
    """Each worker's harness log beside the report: per phase, the rounds' median, the harness's own
    share of it, GO to DONE split term by term (thaw, the server's wake, forward, sync), and DONE
    to frozen, which say which side of a speedup moved (issue 34's 9% on gelu)."""
    for log in work.rglob("harness.log"):
        (out / f"harness-{log.parent.relative_to(work).as_posix().replace('/', '-')}.log").write_bytes(log.read_bytes())


def env_settings(pairs: list[str]) -> dict:
    """--env's KEY=VALUE pairs, typed by EnvConfig's fields (a bool, a number, a string or one of its
    enums; the GPU machines have no omegaconf to merge with): an unknown key or a bad value names itself."""
    fields = {f.name: str(f.type) for f in dataclasses.fields(EnvConfig)}
    settings = {}
    for pair in pairs:
        key, equals, text = pair.partition("=")
        if not equals or key not in fields:
            raise SystemExit(f"--env {pair}: expected KEY=VALUE with KEY one of env's fields (configs/schema.py EnvConfig)")
        settings[key] = _typed(key, fields[key], text)
    return settings


def _typed(key: str, kind: str, text: str):
    enum = getattr(schema, kind, None)
    try:
        if kind == "bool":
            return {"true": True, "false": False}[text.lower()]
        if kind in ("int", "float", "str"):
            return {"int": int, "float": float, "str": str}[kind](text)
        if isinstance(enum, type) and issubclass(enum, Enum):
            return enum(text)
    except (KeyError, ValueError):
        raise SystemExit(f"--env {key}={text}: not a valid {kind}") from None
    raise SystemExit(f"--env {key}: a {kind} cannot be set here; set it in configs/schema.py's default for the run")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-corpus", action="store_true")
    parser.add_argument("--skip-fidelity", action="store_true")
    parser.add_argument("--cases", nargs="*", default=[], help="corpus case names to run (default: every cuda case)")
    parser.add_argument("--kernels", nargs="*", default=[], help="legit cuda kernels to measure (default: all)")
    parser.add_argument("--env", nargs="*", default=[], metavar="KEY=VALUE",
                        help="EnvConfig settings of the fidelity evaluations, e.g. eager_recheck=true baseline_servers=2")
    args = parser.parse_args()
    env = env_settings(args.env)
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-integrity-", dir="/var/tmp"))
    tasks = {t.id: t for t in load_tasks()[0]}
    report = {"device": torch.cuda.get_device_name(), "corpus": [], "fidelity": []}

    def save() -> None:
        (args.out / "integrity.json").write_text(json.dumps(report, indent=1, default=str))
        keep_harness_logs(work, args.out)

    if not args.skip_corpus:
        report["corpus"] = run_corpus(work, tasks, args.cases)
        save()
    if not args.skip_fidelity:
        report["fidelity_env"] = env
        run_fidelity(work, tasks, args.repeats, args.kernels, report["fidelity"], save, env)
    save()
    print("\ncase | verdict ok")
    for row in report["corpus"]:
        print(f"{row['case']} | {'ok' if row['ok'] else 'BAD'} ({row['failure']}, m={row['milestone']}{', hard' if row['hard'] else ''})")
    print("\nkernel | env speedups | milestones | spread | do_bench | kernelbench | env vs do_bench | env vs kernelbench")
    for row in report["fidelity"]:
        speeds = ", ".join(f"{e['speedup']:.3f}" if e["speedup"] else str(e["failure"]) for e in row["env"])
        if "median" in row:
            ind = row["independent"]
            marks = " ".join(str(e["milestone"]) for e in row["env"])
            print(f"{row['kernel']} | {speeds} | {marks} | {row['spread']:.1%} | {ind['do_bench']:.3f} | {ind['kernelbench']:.3f} | "
                  f"{row['vs_do_bench']:+.1%} | {row['vs_kernelbench']:+.1%}")
        else:
            print(f"{row['kernel']} | {speeds} | - | - | - | - | - | -")


if __name__ == "__main__":
    main()
