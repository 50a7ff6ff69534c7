"""Size the starter tasks for one backend from measured eager times, and write the new PRESETS.

    python scripts/size_starter_tasks.py --backend cuda [--target-ms 3] [--write] [--out sizes.json] [PATH ...]

Each task's preset for the backend has a leading size (its first key: batch_size, M,
num_tokens) that its runtime grows with. This times the reference's eager forward as
`cuda-agent tasks check` does (tasks/screen.py), then doubles or halves that size until the
median lands within a factor of sqrt(2) of --target-ms, or its inputs and outputs would pass
--max-gib. Sizes stay powers of two times their old value, so a kernel tiled for the old sizes
still tiles. --write rewrites each task file's one-line ``"BACKEND": {...}`` preset in place.
Why: the paper keeps eager times within 1-100 ms, where the timing protocol resolves a speedup;
an H100 runs the old GPU sizes in ~0.1 ms (README: the starter tasks).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tasks.loader import load_tasks  # noqa: E402
from tasks.screen import _outputs, _time_ms  # noqa: E402
from tasks.task import Task, build_problem  # noqa: E402

STARTER = Path(__file__).resolve().parent.parent / "tasks" / "starter"


def measure(task: Task, backend: str, preset: dict) -> tuple[float, float]:
    """(median eager ms, GiB of inputs and outputs) of the task at ``preset``."""
    device = "cuda" if backend == "cuda" else "cpu"
    problem = build_problem(dataclasses.replace(task, presets={**task.presets, backend: preset}), backend)
    torch.manual_seed(0)
    with torch.device(device):  # inputs made where they run: GiBs of randn on the host take seconds
        model = problem.model_cls(*problem.get_init_inputs()).to(device).eval()
        inputs = [v.to(device) if isinstance(v, torch.Tensor) else v for v in problem.get_inputs()]
    outputs = _outputs(model, inputs)
    gib = sum(t.numel() * t.element_size() for t in [*inputs, *outputs] if isinstance(t, torch.Tensor)) / 2**30
    return _time_ms(lambda: _outputs(model, inputs), 10, device), gib


def size(task: Task, backend: str, target_ms: float, max_gib: float, rounds: int = 6) -> dict:
    """The task's preset for ``backend`` moved toward ``target_ms`` by powers of two of its leading size."""
    preset = dict(task.presets.get(backend, {}))
    key = next((k for k, v in preset.items() if isinstance(v, int)), None)
    row = {"task_id": task.id, "key": key, "old": dict(preset)}
    ms, gib = measure(task, backend, preset)
    row["old_ms"] = ms
    for _ in range(rounds):
        if key is None or abs(math.log2(ms / target_ms)) <= 0.5:
            break
        factor = 2 if ms < target_ms else 0.5
        value = int(preset[key] * factor)
        if value < 1 or (factor > 1 and gib * 2 > max_gib):
            row["stopped"] = "at the memory cap" if value >= 1 else "at size 1"
            break
        trial = {**preset, key: value}
        try:
            trial_ms, trial_gib = measure(task, backend, trial)
        except torch.OutOfMemoryError:
            row["stopped"] = "out of device memory"
            break
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # the last size's GiBs, before the next is made
        if abs(math.log2(trial_ms / ms)) < 0.25:  # twice the size, about the same time: not what sets it (an LSTM's steps)
            row["stopped"] = "the time does not follow this size"
            break
        crossed = (trial_ms > target_ms) != (ms > target_ms)
        if crossed and abs(math.log(trial_ms / target_ms)) > abs(math.log(ms / target_ms)):
            break  # crossed the target, and the size before was the closer
        preset, ms, gib = trial, trial_ms, trial_gib
        if crossed:
            break
    row.update(new=preset, new_ms=ms, gib=round(gib, 2))
    return row


def rewrite(path: Path, backend: str, preset: dict) -> bool:
    """Replace the file's one-line ``"BACKEND": {...}`` entry of PRESETS; False when it has none."""
    text = path.read_text()
    pattern = re.compile(rf'^(\s*"{backend}": )\{{.*\}}(,?)$', re.MULTILINE)
    new, count = pattern.subn(lambda m: m.group(1) + json.dumps(preset) + m.group(2), text, count=1)
    if count:
        path.write_text(new)
    return bool(count)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=[str(STARTER)], help="task files or folders (default: the starter set)")
    parser.add_argument("--backend", default="cuda", choices=("cpp", "cuda"))
    parser.add_argument("--target-ms", type=float, default=3.0, help="the eager time aimed at")
    parser.add_argument("--max-gib", type=float, default=8.0, help="inputs and outputs together at most this")
    parser.add_argument("--write", action="store_true", help="rewrite each task file's preset")
    parser.add_argument("--out", help="write every row as JSON here")
    args = parser.parse_args()
    tasks, failures = load_tasks([Path(p) for p in args.paths])
    for failure in failures:
        print(f"failed to load {failure.path}: {failure.reason}", file=sys.stderr)
    rows = []
    for task in tasks:
        try:
            row = size(task, args.backend, args.target_ms, args.max_gib)
        except Exception as err:  # one task's failure is reported, the others still sized
            row = {"task_id": task.id, "error": f"{type(err).__name__}: {err}"}
        if args.write and "new" in row and row["new"] != row["old"]:
            row["written"] = rewrite(Path(task.path), args.backend, row["new"])
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    print("\n| task | old ms | new ms | GiB | new preset |\n| --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['task_id']} | error: {r['error'][:80]} | | | |")
        else:
            print(f"| {r['task_id']} | {r['old_ms']:.3f} | {r['new_ms']:.3f} | {r['gib']} | {json.dumps(r['new'])} {r.get('stopped', '')} |")
    return 1 if failures or any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
