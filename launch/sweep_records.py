"""What an evaluation sweep keeps in its folder: the records of results.jsonl, audit.jsonl and
autotune.jsonl, the sweep's identity (sweep.json), the machine, and the solution store.

    results.jsonl   one record per episode (episode_record) or scored solution, appended as each ends
    sweep.json      what the results were made with (IDENTITY): a rerun that differs is refused
    solutions/      each episode's final files, by task and sample, with their hash

Read by the sweep (launch/eval.py) as it resumes and by its report (launch/eval_report.py).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from configs.load import ConfigError
from protocol.results import EvalResult
from tasks.solution import read_solution, write_solution
from tasks.task import Task, TaskError

RESULTS, AUDIT, AUTOTUNE, SWEEP = "results.jsonl", "audit.jsonl", "autotune.jsonl", "sweep.json"
SOLUTIONS = "solutions"
# What must match between a sweep's runs for their results to share one report.
IDENTITY = ("policy", "backend", "max_turns", "compile_mode", "rules", "confidence", "baseline_timing")
# What a sweep folder recorded before its identity had the key: a sweep resumes under them.
IDENTITY_BEFORE = {"rules": "strict", "baseline_timing": "cached"}


# --------------------------------------------------------------------------- the results files


def latest_records(records: list[dict[str, Any]], key: str = "episode_id") -> list[dict[str, Any]]:
    """The last record of each key, in first-seen order: a retried episode's new record replaces its old one."""
    latest: dict[str, dict[str, Any]] = {}
    for r in records:
        latest.pop(r[key], None)
        latest[r[key]] = r
    return list(latest.values())


def recorded_identity(out: Path, identity: dict[str, Any]) -> dict[str, Any]:
    """How the folder's results were made, as its sweep.json records it (older folders: IDENTITY_BEFORE
    for what they did not record); ``identity`` for a folder that records none."""
    path = out / SWEEP
    return {**IDENTITY_BEFORE, **json.loads(path.read_text())} if path.exists() else identity


def check_identity(out: Path, identity: dict[str, Any]) -> None:
    """Refuse to add results made another way to a folder's results; record the identity on first use."""
    path = out / SWEEP
    if path.exists():
        before = recorded_identity(out, identity)
        diff = [f"{k}: {before.get(k)!r} there, {identity[k]!r} now" for k in IDENTITY if before.get(k) != identity[k]]
        if diff:
            raise ConfigError(f"{out} holds results of another sweep ({'; '.join(diff)}): give another eval.out_dir "
                              "(--out), or delete that folder to start again")
        return
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(identity, indent=2) + "\n")


def describe_machine(backend: str) -> str:
    """What this machine times a backend's kernels on, as the report names it: the GPU for cuda,
    the CPU's model and count for cpp."""
    if backend == "cuda":
        try:
            import torch

            if torch.cuda.is_available():
                return ", ".join(sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())}))
        except Exception:  # noqa: BLE001 - a description, never a reason to fail a sweep
            pass
        return "a GPU (not identified)"
    model = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                  if line.startswith("model name")), "a CPU")
    return f"{model} ({os.cpu_count()} CPUs)"


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def record_machine(out: Path, backend: str) -> None:
    """Add this machine to sweep.json's list of those the sweep ran on (a sweep may resume elsewhere):
    the report says what its numbers were measured on. Not part of the identity: a sweep may move."""
    path = out / SWEEP
    data = json.loads(path.read_text())
    machine = describe_machine(backend)
    if machine not in data.setdefault("machines", []):
        data["machines"].append(machine)
        path.write_text(json.dumps(data, indent=2) + "\n")


# --------------------------------------------------------------------------- records


def solution_hash(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    return h.hexdigest()[:16]


def save_solution(out: Path, task_id: str, sample: int, files: dict[str, str]) -> str:
    """The files under solutions/TASK/sK/; returns that folder relative to ``out``."""
    rel = Path(SOLUTIONS) / task_id / f"s{sample}"
    folder = out / rel
    folder.mkdir(parents=True, exist_ok=True)
    write_solution(folder, files)
    return str(rel)


def eval_fields(final: dict[str, Any] | None) -> dict[str, Any]:
    """The numbers a report needs from a final evaluation (EvalResult.to_dict()), flat."""
    if not final:
        return {"milestone": 0, "failure": "no_evaluation", "message": "", "violations": [], "eager_ms": None,
                "compiled_ms": None, "candidate_ms": None, "eager_recheck_ms": None, "speedup_eager": None, "speedup_compile": None, "interval_eager": None, "interval_compile": None,
                "noise": None, "compile_s": None}
    result = EvalResult.from_dict(final)
    return {
        "milestone": int(result.milestone),
        "failure": result.failure,
        "message": result.message.splitlines()[0][:1000] if result.message else "",  # a CUDA out-of-memory line names each process's share past 300
        "violations": [{"guard": v.guard, "reason": v.reason[:200]} for v in result.violations],
        "eager_ms": result.eager.median_ms if result.eager else None,
        "compiled_ms": result.compiled.median_ms if result.compiled else None,
        "candidate_ms": result.candidate.median_ms if result.candidate else None,
        # eager again right after the candidate's rounds: its distance from eager_ms widened the intervals
        "eager_recheck_ms": result.eager_recheck.median_ms if result.eager_recheck else None,
        "speedup_eager": result.speedup_vs_eager,
        "speedup_compile": result.speedup_vs_compile,
        # the speedups' bootstrap intervals at env.reward.confidence ([low, high]; None without timings)
        "interval_eager": list(result.eager_interval) or None,
        "interval_compile": list(result.compile_interval) or None,
        "noise": max((t.noise for t in (result.eager, result.compiled, result.candidate) if t), default=None),
        "compile_s": round(result.compile_s, 2),  # the candidate's build (its load_inline import included); 0 on a cache hit
    }


def episode_record(traj: Any, task: Task, sample: int, out: Path) -> dict[str, Any]:
    files = traj.meta.get("solution") or {}
    return {
        "episode_id": traj.episode_id, "task_id": task.id, "level": task.level, "sample": sample,
        **eval_fields(traj.final_eval),
        "stop_reason": traj.stop_reason, "error": traj.error[:300],
        "turns": len(traj.turns), "generated_tokens": traj.num_generated, "context_tokens": traj.num_tokens,
        "invalid_calls": traj.invalid_calls, "token_level": traj.token_level, "wall_s": round(traj.wall_s, 2),
        "solution": save_solution(out, task.id, sample, files) if files else None,
        "solution_hash": solution_hash(files) if files else None,
    }


def episode_id(task: Task, sample: int) -> str:
    return f"eval-{task.id.replace('/', '-')}-s{sample}"


# --------------------------------------------------------------------------- existing solutions


def find_solutions(root: Path, tasks: list[Task]) -> dict[str, dict[str, str]]:
    """Solution files per task id, from any of these layouts under ``root``:

        TASK_ID/model_new.py (+ kernel.cpp|kernel.cu ...)   a solution folder, by id or by name
        levelL/NAME/model_new.py, NAME/model_new.py ...     (level1/01_gelu/ or 01_gelu/)
        TASK_ID.py or NAME.py                               one file defining ModelNew (KernelBench style)
        level_L_problem_P_sample_S_kernel.py               KernelBench's generated runs (lowest sample)
    """
    if not root.is_dir():
        raise TaskError(f"solutions folder {str(root)!r} does not exist (or is not a folder)")
    found: dict[str, dict[str, str]] = {}
    generated = {}
    for path in sorted(root.glob("level_*_problem_*_sample_*_kernel.py")):
        m = re.match(r"level_(\d+)_problem_(\d+)_sample_(\d+)_kernel\.py$", path.name)
        if m:
            generated.setdefault((int(m[1]), int(m[2])), path)
    for task in tasks:
        name = task.id.rsplit("/", 1)[-1]
        for stem in dict.fromkeys((task.id, f"level{task.level}/{name}", name)):
            folder, single = root / stem, root / f"{stem}.py"
            if (folder / "model_new.py").is_file():
                found[task.id] = read_solution(folder)
                break
            if single.is_file():
                found[task.id] = {"model_new.py": single.read_text()}
                break
        else:
            number = re.match(r"(\d+)_", name)
            path = generated.get((task.level, int(number[1]))) if number else None
            if path is not None:
                found[task.id] = {"model_new.py": path.read_text()}
    return found
