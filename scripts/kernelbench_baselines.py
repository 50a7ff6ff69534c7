"""The environment's baselines of every problem, compared with KernelBench's published ones.

    python scripts/kernelbench_baselines.py --out DIR [--tasks PATHS...] [--gpus 0,1] [--compile-procs N]
                                            [--stage all|compile|time|compare]
                                            [--timing ../shared/kernelbench/results/timing/H100_Modal] [key=value ...]

Each problem's eager and torch.compile baselines are measured as a worker measures a task's
first ones (env_pool/evaluate.measure_baselines: the trusted server, the harness's protocol,
the plausibility rules), without a candidate. key=value pairs override env settings.

1. Compile: every problem's torch.compile baseline compiled ahead (env_pool/trusted/baseline_compile.py),
   ``--compile-procs`` processes at once over the GPUs, into the inductor cache the workers share;
   a worker's compile is then a cache hit instead of 5-60 s of the timing lane.
2. Time: one worker per GPU (its own CPUs, harness and warm trusted servers), problems dealt
   round-robin; each result is a line of DIR/baselines-gpuN.jsonl as it comes.
3. Compare: DIR/baselines.md and baselines.json (scripts/compare_baselines.py), with a likely
   cause for each problem outside the band.

Rerunning continues: problems with a baseline are skipped (a failed one is tried again), and
compiled ones are not compiled again. Without a GPU it runs on the cpp backend, one worker.
``--stage`` runs one stage alone (a GPU machine that times other work on one GPU can compile
on another meanwhile). A benchmark measures; nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgpack  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn  # noqa: E402

from env_pool.evaluate import cpu_share  # noqa: E402
from env_pool.trusted.server_pool import compile_env  # noqa: E402
from protocol.records import read_records  # noqa: E402
from tasks.loader import load_tasks  # noqa: E402

HERE = Path(__file__).resolve().parent
KERNELBENCH = HERE.parents[1] / "shared" / "kernelbench"
COMPILED, RESULTS = "compiled.jsonl", "baselines-gpu{}.jsonl"
WORKER_ENV = {"warm_servers": 0, "warm_baseline_servers": 3}  # no candidates here; trusted servers started ahead


def measured(out: Path) -> dict[str, dict]:
    """task id -> its latest record with a baseline, over every worker's file."""
    done: dict[str, dict] = {}
    for path in sorted(out.glob(RESULTS.format("*"))):
        for r in read_records(path):
            if r.get("eager_ms"):
                done[r["task_id"]] = r
    return done


def device_of(gpu: int) -> str:
    """The CUDA_VISIBLE_DEVICES entry of torch's device ``gpu`` in this process (it may see a subset)."""
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return visible[gpu] if gpu < len(visible) else str(gpu)


def env_overrides(items: list[str]) -> dict:
    cfg = dict(WORKER_ENV)
    for item in items:
        key, _, value = item.partition("=")
        try:
            cfg[key] = json.loads(value)
        except json.JSONDecodeError:
            cfg[key] = value
    return cfg


# --------------------------------------------------------------------------- 1. compile ahead


COMPILE_SHARE = 0.8  # of a GPU's free memory that compiles at once may fill (the rest: the driver, torch's cache)
COMPILE_FOOTPRINT = 4  # a compile's device memory in its inputs' sizes: inputs, outputs, inductor's intermediates


def compile_all(args, tasks: list, inductor: Path, progress: Progress) -> None:
    """Compile every task not compiled (nor timed) yet; each outcome a line of COMPILED.

    Small problems compile --compile-procs at once; problems whose footprint does not fit a
    process's share of the device compile after them, one per GPU (12 GiB-sized compiles at once
    ran the H100 out of memory, and those compiles were lost)."""
    from env_pool.trusted.baseline_compile import forget_autotuning

    log = args.out / COMPILED
    done = {r["id"] for r in read_records(log) if r.get("ok")} | set(measured(args.out))
    todo = [t for t in tasks if t.id not in done]
    bar = progress.add_task("compile ahead", total=len(tasks), completed=len(tasks) - len(todo))
    procs = max(1, min(args.compile_procs, len(todo)))
    small, large = split_by_footprint(todo, args.backend, device_share_mb(args.gpus, procs))
    with log.open("a") as sink:
        for wave, wave_procs in ((small, procs), (large, max(1, len(args.gpus)))):
            for line in compile_wave(args, wave, wave_procs, inductor):
                sink.write(line)
                sink.flush()
                progress.advance(bar)
    forget_autotuning(inductor)


def device_share_mb(gpus: list[int], procs: int) -> float:
    """One compile process's share of the smallest GPU's free memory, in MB (unbounded without a GPU)."""
    if not gpus:
        return float("inf")
    import torch

    free = min(torch.cuda.mem_get_info(g)[0] for g in gpus) / 2**20
    return free * COMPILE_SHARE / max(1, procs / len(gpus))


def split_by_footprint(tasks: list, backend: str, share_mb: float) -> tuple[list, list]:
    """(tasks whose compile fits share_mb, the others); a task whose size cannot be read counts as large."""
    small, large = [], []
    for task in tasks:
        size = input_mb(task, backend)
        (small if size is not None and size * COMPILE_FOOTPRINT <= share_mb else large).append(task)
    return small, large


def compile_wave(args, tasks: list, procs: int, inductor: Path):
    """Compile ``tasks`` in ``procs`` processes at once into ``inductor``, dealt round-robin; yield each outcome's JSON line."""
    threads = int(env_overrides(args.overrides).get("threads", 1))
    children = []
    for k in range(min(procs, len(tasks))):
        jobs = [{"task": t.to_dict(), "backend": args.backend, "compile_mode": args.compile_mode, "threads": threads}
                for t in tasks[k::procs]]
        env = {**os.environ, **compile_env(str(inductor), threads), "PYTHONPATH": str(HERE.parent)}
        if args.gpus:
            env["CUDA_VISIBLE_DEVICES"] = device_of(args.gpus[k % len(args.gpus)])
        child = subprocess.Popen([sys.executable, "-m", "env_pool.trusted.baseline_compile"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=False)
        child.stdin.write(msgpack.packb(jobs))
        child.stdin.close()
        children.append(child)
    for child in children:  # each one's lines in turn; the others run on meanwhile
        for line in child.stdout:
            yield line.decode()
        child.wait()


# --------------------------------------------------------------------------- 2. time, one worker per GPU


def worker(args, index: int) -> None:
    """One GPU's worker (a process of its own, on its own CPUs): measure its share of the problems."""
    from configs.schema import EnvConfig
    from env_pool.evaluate import Baseline, EvalContext, measure_baselines

    work = args.out / f"work-gpu{index}"
    (work / "reference").mkdir(parents=True, exist_ok=True)
    link = work / "reference" / "inductor"
    if not link.exists():
        link.symlink_to(args.out / "inductor", target_is_directory=True)
    ctx = EvalContext(cfg=EnvConfig(**{**env_overrides(args.overrides), "work_dir": str(work)}))
    ctx.cfg.backend = args.backend
    ctx.cfg.compile_mode = args.compile_mode
    tasks = {t.id: t for t in load_tasks(args.tasks)[0]}
    with (args.out / RESULTS.format(index)).open("a") as sink:
        for task_id in args.share:
            begin = time.perf_counter()
            got = asyncio.run(measure_baselines(ctx, tasks[task_id]))
            record = {"task_id": task_id, "level": tasks[task_id].level, "gpu": index,
                      "wall_s": round(time.perf_counter() - begin, 2), **facts(tasks[task_id], args.backend)}
            if isinstance(got, Baseline):
                record.update(eager_ms=got.eager.median_ms, eager_iqr_ms=got.eager.iqr_ms,
                              compiled_ms=got.compiled.median_ms, compiled_iqr_ms=got.compiled.iqr_ms)
            else:
                record["error"] = got[:500]
            sink.write(json.dumps(record) + "\n")
            sink.flush()
    if ctx._harness is not None:
        ctx._harness.close()


def facts(task, backend: str) -> dict:
    """What explains a baseline that differs from KernelBench's: modules whose train and eval modes differ,
    convolutions (cuDNN's TF32, which the environment turns off), the data's size."""
    record = {"train_mode_modules": sorted({m for m in ("BatchNorm", "Dropout", "InstanceNorm") if m in task.source}),
              "convolutions": sorted(set(re.findall(r"\bConv(?:Transpose)?[123]d\b|\bconv(?:_transpose)?[123]d\b", task.source)))}
    size = input_mb(task, backend)
    if size is not None:
        record["input_mb"] = round(size, 2)
    return record


def input_mb(task, backend: str) -> float | None:
    """The size of a problem's tensor inputs in MB, read on the meta device (None where that fails)."""
    import torch

    from tasks.task import build_problem

    try:
        with torch.device("meta"):
            values = build_problem(task, backend).get_inputs()
    except Exception:  # noqa: BLE001  (a fact for sizing and the report, not the measurement)
        return None
    return sum(v.nbytes for v in values if isinstance(v, torch.Tensor)) / 2**20


def time_all(args, tasks: list, progress: Progress) -> None:
    """One worker process per GPU, each pinned to its share of this machine's CPUs; progress read from their files."""
    done = measured(args.out)
    todo = [t.id for t in tasks if t.id not in done]
    bar = progress.add_task("baselines", total=len(tasks), completed=len(tasks) - len(todo))
    lanes = args.gpus or [0]
    cpus = sorted(os.sched_getaffinity(0))
    children = []
    for k, gpu in enumerate(lanes):
        share = cpu_share(cpus, k, len(lanes))
        command = [sys.executable, __file__, "--worker", str(k), "--share", *todo[k::len(lanes)], "--cpus",
                   *map(str, share), "--out", str(args.out), "--backend", args.backend, "--compile-mode", args.compile_mode,
                   "--tasks", *map(str, args.tasks), "--", *args.overrides]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": device_of(gpu)} if args.gpus else dict(os.environ)
        log = (args.out / f"worker-gpu{k}.log").open("a")
        children.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
    start = _lines(args.out)
    while any(c.poll() is None for c in children):  # each problem ends as one line of a worker's file
        time.sleep(2)
        progress.update(bar, completed=len(tasks) - len(todo) + _lines(args.out) - start)


def _lines(out: Path) -> int:
    return sum(len(read_records(p)) for p in out.glob(RESULTS.format("*")))


# --------------------------------------------------------------------------- 3. compare


def compare(args) -> None:
    from scripts import compare_baselines

    if not (args.timing / compare_baselines.FILES["eager"]).exists():
        print(f"no published timings at {args.timing}: comparison skipped")
        return
    compare_baselines.main([str(args.out), "--out", str(args.out), "--timing", str(args.timing)])


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tasks", type=Path, nargs="+", default=[KERNELBENCH / f"level{n}" for n in (1, 2, 3)])
    parser.add_argument("--gpus", default=None, help="GPU indices, comma-separated (default: every GPU torch sees)")
    parser.add_argument("--compile-procs", type=int, default=max(1, len(os.sched_getaffinity(0)) // 2))
    parser.add_argument("--compile-mode", default="default", choices=("default", "max-autotune"))
    parser.add_argument("--backend", default=None, choices=("cpp", "cuda"))
    parser.add_argument("--timing", type=Path, default=KERNELBENCH / "results" / "timing" / "H100_Modal")
    parser.add_argument("--stage", default="all", choices=("all", "compile", "time", "compare"),
                        help="one stage alone (time without compile: each worker compiles in its build)")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--share", nargs="*", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--cpus", type=int, nargs="*", default=[], help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="env settings, key=value")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    return args


def main() -> None:
    args = parse()
    if args.worker is not None:
        os.sched_setaffinity(0, args.cpus)
        return worker(args, args.worker)
    import torch

    gpus = torch.cuda.device_count()
    args.gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else list(range(gpus))
    args.backend = args.backend or ("cuda" if gpus else "cpp")
    if args.backend == "cpp":
        args.gpus = []
    tasks, failures = load_tasks(args.tasks)
    for f in failures:
        print(f"not loaded: {f}")
    if not tasks:
        sys.exit(f"no problems found under {' '.join(map(str, args.tasks))}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "inductor").mkdir(exist_ok=True)
    columns = (TextColumn("{task.description:<14}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns) as progress:
        if args.stage in ("all", "compile"):
            compile_all(args, tasks, args.out / "inductor", progress)
        if args.stage in ("all", "time"):
            time_all(args, tasks, progress)
    if args.stage == "compile":
        return
    failed = {r["task_id"]: r["error"] for p in args.out.glob(RESULTS.format("*")) for r in read_records(p) if r.get("error")}
    ids = {t.id for t in tasks}
    ok = {k: v for k, v in measured(args.out).items() if k in ids}
    for task_id, why in sorted(failed.items()):
        if task_id not in ok:
            print(f"no baseline: {task_id}: {why[:200]}")
    print(f"{len(ok)} of {len(tasks)} problems have baselines ({args.out})")
    compare(args)


if __name__ == "__main__":
    main()
