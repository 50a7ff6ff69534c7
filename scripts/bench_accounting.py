"""What the environment's accounting gives legitimate kernels: speedups and baselines, against KernelBench's.

    python scripts/bench_accounting.py --kernelbench DIR --out FILE.json [--problems 19_ReLU ...] [key=value ...]

Evaluates level 1's twelve elementwise activations (scripts/kernelbench_solutions.py's CUDA
kernels, KernelBench's own load_inline form) in full mode, one env worker in this process (no
Ray), and writes for each: the environment's eager, torch.compile and candidate times, the
speedups, the milestone, the verification sets, and the baselines' ratios to KernelBench's
published H100 timings. Run it with the code before and after a change to the timing (the same
machine, one lease: PYTHONPATH picks the code), to show the change does not bias legitimate
kernels. Needs torch, omegaconf and msgpack. A benchmark measures; nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

from configs.schema import EnvConfig
from env_pool.evaluate import EvalContext, evaluate
from tasks.loader import load_task_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_baselines import load_published  # noqa: E402
from kernelbench_solutions import ACTIVATIONS, kernel_solution  # noqa: E402


def measure(ctx: EvalContext, path: Path, name: str) -> dict:
    task = load_task_file(path, base=path.parent.parent)  # base: its id is "level1/NAME"
    begin = time.perf_counter()
    result = asyncio.run(evaluate(ctx, task, {"model_new.py": kernel_solution(name)}, "full"))
    row = {"problem": name, "failure": result.failure, "milestone": int(result.milestone), "message": result.message[:300],
           "seconds": round(time.perf_counter() - begin, 1), "sets": sorted({c.inputs for c in result.checks if hasattr(c, "inputs")})}
    for key in ("eager", "compiled", "candidate"):
        timing = getattr(result, key)
        row[key] = timing.median_ms if timing else None
    row["vs_eager"] = result.speedup_vs_eager
    row["vs_compile"] = result.speedup_vs_compile
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernelbench", type=Path, required=True, help="KernelBench's folder (level1/, results/timing/)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--problems", nargs="*", default=list(ACTIVATIONS), help="level-1 problem names (default: the twelve)")
    parser.add_argument("settings", nargs="*", metavar="key=value", help="env settings (configs/schema.py EnvConfig)")
    args = parser.parse_args()
    settings = {"backend": "cuda", "warm_servers": 6, "warm_baseline_servers": 1, "work_dir": str(args.out.parent / "work")}
    for item in args.settings:
        key, _, value = item.partition("=")
        settings[key] = type(getattr(EnvConfig(), key))(value) if not isinstance(getattr(EnvConfig(), key), bool) else value == "true"
    ctx = EvalContext(cfg=EnvConfig(**settings))
    published = load_published(args.kernelbench / "results" / "timing" / "H100_Modal")
    rows = json.loads(args.out.read_text()) if args.out.exists() else []  # a rerun resumes
    for name in [p for p in args.problems if p not in {r["problem"] for r in rows}]:
        row = measure(ctx, next((args.kernelbench / "level1").glob(f"{name}.py")), name)
        key = f"level1/{name}"
        theirs = {kind: published.get(kind, {}).get(key) for kind in ("eager", "compile")}
        row["eager_ratio"] = row["eager"] / theirs["eager"] if row["eager"] and theirs["eager"] else None
        row["compile_ratio"] = row["compiled"] / theirs["compile"] if row["compiled"] and theirs["compile"] else None
        rows.append(row)
        print(json.dumps(row), flush=True)
        args.out.write_text(json.dumps(rows, indent=1))
    print(f"{'problem':16} {'ms':>7} {'eager':>7} {'compile':>7} {'x eager':>8} {'x comp':>7} {'eag/KB':>7} {'cmp/KB':>7} m")
    for r in rows:
        f = lambda v, d=3: f"{v:.{d}f}" if isinstance(v, float) else "-"  # noqa: E731
        print(f"{r['problem']:16} {f(r['candidate'])} {f(r['eager']):>7} {f(r['compiled']):>7} {f(r['vs_eager'], 2):>8} "
              f"{f(r['vs_compile'], 2):>7} {f(r['eager_ratio'], 2):>7} {f(r['compile_ratio'], 2):>7} {r['milestone']}")
    ratios = [r["eager_ratio"] for r in rows if r["eager_ratio"]]
    if ratios:
        print(f"geomean eager/KernelBench {statistics.geometric_mean(ratios):.3f} over {len(ratios)}")


if __name__ == "__main__":
    main()
