"""The environment's speed: wall time per evaluation, and throughput under concurrent load.

    python scripts/bench_env_speed.py --out DIR [--backend cpp|cuda] [--repeats 5] [--gap-s 0] [--load-s 120]
                                      [--concurrency 8] [--skip-load] [--skip-inline] [key=value ...]

Runs the environment in this process as an EnvWorker does (its evaluation context, no Ray). key=value
pairs override env settings (``warm_servers=0`` measures without warm servers). Writes
DIR/env_speed.json and prints a table. A benchmark measures; nothing here asserts a time.

1. Latency: a correct fast-path kernel (cached compile after its first), per mode (compile,
   verify, full): the first evaluation on a fresh worker (cold: the harness starts, full mode
   times the baselines), then ``--repeats`` more (warm), ``--gap-s`` apart (0: back to back, so
   each waits for the start-up of the server the one before it used, where start-ups are slower
   than evaluations: 2 cores).
2. load_inline: a KernelBench-style solution's first evaluation in compile mode on a fresh
   worker (its build, cold) and again (its cache), without and then with the precompiled
   torch/extension.h (env.pch_dir; its one-off build is timed too).
3. Load: ``--concurrency`` episodes submit a mix for ``--load-s`` seconds (each: a compile
   error, a wrong kernel, then a correct one in verify and full mode, with fresh sources so
   nothing is a cache hit): candidates per minute, and the timing lane's busy fraction.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from configs.schema import EnvConfig  # noqa: E402
from env_pool.evaluate import EvalContext, evaluate  # noqa: E402
from tasks.loader import load_tasks  # noqa: E402
from tests.corpus_cases import files_of  # noqa: E402

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "env_corpus"
# Per backend: (task, corpus case) of each role. On the H100 the GELU's eager time is within the
# timing protocol's noise (speed not judged there), so the CUDA timings use the matmul.
KERNELS = {
    "cpp": {"good": ("level1/01_gelu", "legit/gelu_omp"), "broken": ("level1/01_gelu", "hacks/compile_error"),
            "wrong": ("level1/01_gelu", "hacks/round_3_digits"), "inline": ("level1/02_swish", "legit/swish_load_inline")},
    "cuda": {"good": ("level1/10_matmul", "legit/matmul_tiled_cuda"), "broken": ("level1/10_matmul", "hacks/compile_error"),
             "wrong": ("level1/03_softmax", "hacks/zero_output_softmax_cuda"),
             "inline": ("level1/01_gelu", "legit/gelu_load_inline_cuda")},
}


def context(args, work: Path) -> EvalContext:
    """A worker's evaluation context with the command line's env settings (values as JSON where they parse)."""
    cfg = {"work_dir": str(work)}
    for item in args.overrides:
        key, _, value = item.partition("=")
        try:
            cfg[key] = json.loads(value)
        except json.JSONDecodeError:
            cfg[key] = value
    env = EnvConfig(**cfg)
    env.backend = args.backend
    return EvalContext(cfg=env)


def fresh(files: dict[str, str], tag: int) -> dict[str, str]:
    """The same solution with a comment that makes its sources (and compile-cache key) new."""
    return {name: (text + f"\n// bench {tag}\n" if name.endswith((".cpp", ".cu")) else text + f"\n# bench {tag}\n")
            for name, text in files.items()}


def close(ctx: EvalContext) -> None:
    if ctx._harness is not None:
        ctx._harness.close()


def timed(ctx: EvalContext, task, files: dict, mode: str) -> dict:
    begin = time.perf_counter()
    result = asyncio.run(evaluate(ctx, task, files, mode))
    return {"wall_s": time.perf_counter() - begin, "compile_s": result.compile_s, "cache_hit": result.cache_hit,
            "failure": result.failure, "milestone": int(result.milestone), "warm_server": result.warm_server,
            "message": result.message[:200]}


def case(args, tasks: dict, role: str):
    task_id, folder = KERNELS[args.backend][role]
    return tasks[task_id], files_of(CORPUS / folder)


def latency(args, tasks: dict, root: Path) -> list[dict]:
    task, files = case(args, tasks, "good")
    rows = []
    for mode in ("compile", "verify", "full"):
        ctx = context(args, root / f"latency-{mode}")
        runs = [timed(ctx, task, files, mode)]
        for _ in range(args.repeats):
            time.sleep(args.gap_s)  # the agent's turns between two evaluations: the pool refills meanwhile
            runs.append(timed(ctx, task, files, mode))
        close(ctx)
        warm = [r["wall_s"] for r in runs[1:]]
        rows.append({"what": f"{mode}", "cold_s": runs[0]["wall_s"], "warm_median_s": statistics.median(warm),
                     "warm_min_s": min(warm), "warm_max_s": max(warm), "failures": sorted({str(r["failure"]) for r in runs}),
                     "runs": runs})
    return rows


def inline(args, tasks: dict, root: Path) -> list[dict]:
    """A load_inline solution's build on a fresh worker, without and with the precompiled header, and its cache hit."""
    task, files = case(args, tasks, "inline")
    rows = []
    for label, pch in (("no pch", ""), ("pch", str(root / "pch"))):
        ctx = context(args, root / f"inline-{label}")
        ctx.cfg.pch_dir = pch
        if pch:  # built here, in the foreground, as a worker's background thread would (its time is reported)
            from env_pool.build import inline_pch

            compiler, flags, key = inline_pch.target(args.backend == "cuda")
            begin = time.perf_counter()
            built = inline_pch.build(Path(pch) / key, compiler, flags)
            rows.append({"what": "pch build (once)", "cold_s": time.perf_counter() - begin, "warm_median_s": 0.0,
                         "failures": ["None" if built else "pch failed"], "runs": []})
        cold = timed(ctx, task, files, "compile")
        again = timed(ctx, task, files, "compile")
        close(ctx)
        rows.append({"what": f"load_inline {label}", "cold_s": cold["wall_s"], "warm_median_s": again["wall_s"],
                     "failures": [str(cold["failure"]), str(again["failure"])], "runs": [cold, again]})
    return rows


async def load(args, tasks: dict, root: Path) -> dict:
    ctx = context(args, root / "load")
    mix = [(*case(args, tasks, "broken"), "verify"), (*case(args, tasks, "wrong"), "verify"),
           (*case(args, tasks, "good"), "verify"), (*case(args, tasks, "good"), "full")]
    await evaluate(ctx, *mix[3])  # the task's baselines: measured once per worker, not part of the load
    lane_busy = [0.0]
    lane = ctx.timing_lane

    import contextlib

    @contextlib.asynccontextmanager
    async def counted():
        async with lane():
            begin = time.perf_counter()
            try:
                yield
            finally:
                lane_busy[0] += time.perf_counter() - begin

    ctx.timing_lane = counted
    done: list[dict] = []
    deadline = time.perf_counter() + args.load_s
    counter = [0]

    async def episode() -> None:
        while time.perf_counter() < deadline:
            counter[0] += 1
            tag = counter[0]
            for task, files, mode in mix:
                if time.perf_counter() >= deadline:
                    return
                begin = time.perf_counter()
                result = await evaluate(ctx, task, fresh(files, tag), mode)
                done.append({"mode": mode, "wall_s": time.perf_counter() - begin, "failure": result.failure,
                             "warm_server": result.warm_server})

    begin = time.perf_counter()
    await asyncio.gather(*(episode() for _ in range(args.concurrency)))
    wall = time.perf_counter() - begin
    close(ctx)
    return {"candidates": len(done), "wall_s": wall, "per_minute": 60 * len(done) / wall,
            "lane_busy": lane_busy[0] / wall, "failures": {k: sum(str(d["failure"]) == k for d in done)
                                                            for k in sorted({str(d["failure"]) for d in done})},
            "median_wall_s": statistics.median(d["wall_s"] for d in done) if done else None,
            "warm_servers_used": sum(bool(d["warm_server"]) for d in done)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--backend", default="cpp", choices=("cpp", "cuda"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gap-s", type=float, default=0.0, help="seconds between warm evaluations (an agent's turns)")
    parser.add_argument("--load-s", type=float, default=120.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--skip-load", action="store_true")
    parser.add_argument("--skip-inline", action="store_true")
    parser.add_argument("overrides", nargs="*", help="env settings, key=value")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tasks = {t.id: t for t in load_tasks()[0]}
    with tempfile.TemporaryDirectory(prefix="env-speed-") as tmp:
        root = Path(tmp)
        report = {"backend": args.backend, "overrides": args.overrides, "gap_s": args.gap_s, "latency": latency(args, tasks, root)}
        if not args.skip_inline:
            report["latency"] += inline(args, tasks, root)
        if not args.skip_load:
            report["load"] = asyncio.run(load(args, tasks, root))
    (args.out / "env_speed.json").write_text(json.dumps(report, indent=2))
    print(f"\nenv speed, backend {args.backend} {' '.join(args.overrides)}")
    print(f"{'evaluation':<22}{'cold s':>9}{'warm median s':>15}{'warm min-max s':>17}  failures")
    for row in report["latency"]:
        spread = f"{row.get('warm_min_s', row['warm_median_s']):.2f}-{row.get('warm_max_s', row['warm_median_s']):.2f}"
        print(f"{row['what']:<22}{row['cold_s']:>9.2f}{row['warm_median_s']:>15.2f}{spread:>17}  {','.join(row['failures'])}")
    if "load" in report:
        lo = report["load"]
        print(f"load: {lo['candidates']} candidates in {lo['wall_s']:.0f} s = {lo['per_minute']:.1f}/min; "
              f"lane busy {100 * lo['lane_busy']:.0f}%; median {lo['median_wall_s']:.2f} s; {lo['failures']}")


if __name__ == "__main__":
    main()
