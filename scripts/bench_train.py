#!/usr/bin/env python
"""Training throughput: steps per hour of `cuda-agent train`, asynchronous against synchronous,
on the same config, and the weight-swap seconds each step paid.

Runs the same stage twice (``stage.asynchronous=true``, then ``false``) into two folders and
reads their metrics.jsonl: steps per hour over the steps after the first (the first includes
engine warm-up), the mean learner-step and swap seconds, generated tokens per second, and the
staleness the asynchronous run trained on. Episode lengths spread by themselves with a random
model: it emits end-of-turn at random, so a turn ends anywhere up to rollout.max_new_tokens.

    python scripts/bench_train.py cpu-demo model.path=/tmp/tiny stage.name=single_turn_ppo stage.steps=6 ...
    . .gpu-stack/bin/activate && python scripts/bench_train.py gpu-2xh200 model.path=/tmp/m05 stage.steps=6
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from protocol.records import read_records  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config", nargs="+", help="config files, then key=value overrides (as `cuda-agent train`)")
    p.add_argument("--modes", default="async,sync", help="which runs, in order")
    p.add_argument("--out", default=None, help="also write the JSON result here")
    return p.parse_args()


def summarise(metrics_file: Path, wall_s: float) -> dict:
    rows = read_records(metrics_file)
    timed = rows[1:] if len(rows) > 1 else rows
    span = timed[-1]["time"] - rows[0]["time"] if len(rows) > 1 else 0.0
    mean = lambda key: sum(r.get(key) or 0.0 for r in timed) / len(timed)  # noqa: E731
    generated = sum(r.get("learner/generated_tokens") or 0.0 for r in timed)
    return {
        "steps": len(rows),
        "wall_s": round(wall_s, 1),
        "steps_per_hour": round(len(timed) / span * 3600, 1) if span > 0 else None,
        "step_s": round(span / len(timed), 2) if span > 0 else None,
        "learner_step_s": round(mean("step_s"), 2),
        "swap_s": round(mean("sync/swap_s"), 3),
        "generated_tok_per_s": round(generated / span, 1) if span > 0 else None,
        "staleness_mean": round(mean("buffer/staleness_mean"), 2),
    }


def main() -> dict:
    args = parse_args()
    from configs.load import load_config
    from launch.train import train

    files = [a for a in args.config if "=" not in a]
    overrides = [a for a in args.config if "=" in a]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes.split(","):
            out = Path(tmp) / mode
            cfg = load_config(files, [*overrides, f"stage.asynchronous={str(mode == 'async').lower()}", f"logging.out_dir={out}",
                                      "logging.progress=false", "stage.resume=false"])
            started = time.perf_counter()
            train(cfg)
            results[mode] = summarise(out / "metrics.jsonl", time.perf_counter() - started)
    if "async" in results and "sync" in results and results["sync"]["steps_per_hour"]:
        results["async_vs_sync"] = round(results["async"]["steps_per_hour"] / results["sync"]["steps_per_hour"], 3)
    return results


if __name__ == "__main__":
    result = main()
    keys = ["steps", "wall_s", "steps_per_hour", "step_s", "learner_step_s", "swap_s", "generated_tok_per_s",
            "staleness_mean"]
    modes = [m for m in result if m != "async_vs_sync"]
    print(f"{'':22}" + "".join(f"{m:>12}" for m in modes))
    for key in keys:
        print(f"{key:22}" + "".join(f"{str(result[m][key]):>12}" for m in modes))
    if "async_vs_sync" in result:
        print(f"async / sync steps per hour: {result['async_vs_sync']}")
    print(json.dumps(result))
    out = parse_args().out
    if out:
        Path(out).write_text(json.dumps(result))
