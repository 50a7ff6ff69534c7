"""The corpus's cases as data: where they are, what each expects, and whether a result meets it.

Shared by tests/test_env_corpus.py and scripts/bench_integrity.py (which runs the cuda cases on a GPU).
"""
from __future__ import annotations

import json
from pathlib import Path

from tasks.solution import read_solution

CORPUS = Path(__file__).parent / "env_corpus"


def load_cases(kind: str) -> list[tuple[Path, dict]]:
    """(folder, case.json) of every case under env_corpus/<kind>, sorted by name."""
    return [(folder, json.loads((folder / "case.json").read_text())) for folder in sorted((CORPUS / kind).iterdir())
            if (folder / "case.json").exists()]


def files_of(folder: Path) -> dict[str, str]:
    """A case's solution files: those of the case its case.json names in ``files_from`` (the same
    hack evaluated another way, or another case's kernel; followed as far as it goes), with its
    own files over them."""
    meta = folder / "case.json"
    source = json.loads(meta.read_text()).get("files_from") if meta.exists() else None
    files = files_of(CORPUS / source) if source else {}
    return {**files, **_own_files(folder)}


def _own_files(folder: Path) -> dict[str, str]:
    return {name: text for name, text in read_solution(folder).items() if name != "case.json"}


def verdicts(case: dict) -> list:
    """Every acceptable verdict: expect, then also_ok (a side thread may be caught as a thread or as wrong)."""
    return [case["expect"], *case.get("also_ok", [])]


def meets(result, verdict) -> bool:
    """"pass"; a failure of the named kind (and guard); or, for {"max_milestone": N}, no milestone above N."""
    if verdict == "pass":
        return result.failure is None and int(result.milestone) >= 1 and not result.violations
    if "max_milestone" in verdict:
        return int(result.milestone) <= verdict["max_milestone"]
    guards = {v.guard for v in result.violations}
    return result.failure == verdict["failure"] and verdict.get("guard") in (None, *guards)


def evaluate_in_process(cfg, mode: str = "full", case: str = "relu_omp"):
    """The legitimate corpus case ``case`` evaluated under ``cfg`` (an EnvConfig) by a harness in this
    process (scripts/profile_harness.py), so that a test can spy on the harness's side."""
    import asyncio

    from env_pool.evaluate import EvalContext, evaluate
    from scripts.profile_harness import InProcessHarness
    from tasks.loader import load_tasks

    folder = CORPUS / "legit" / case
    task = {t.id: t for t in load_tasks()[0]}[json.loads((folder / "case.json").read_text())["task"]]
    ctx = EvalContext(cfg=cfg)
    ctx._harness = inproc = InProcessHarness()
    try:
        return asyncio.run(evaluate(ctx, task, files_of(folder), mode))
    finally:
        inproc.close()
