"""A synthesis run's bookkeeping: which candidates each stage dropped and why, and the accepted task folder.

Stages, in order (each candidate ends in exactly one, recorded as one manifest row):
- ``compose``: no chain could be built from the seed;
- ``static``: it does not parse, lacks an entry point, or calls something stochastic;
- ``duplicate``: its normalised AST equals an accepted task's;
- ``near_duplicate``: its AST similarity to an accepted task is at or above the threshold;
- ``contamination``: its AST similarity to a KernelBench problem is at or above the threshold
  (the row names the closest problem);
- ``screen``: the dynamic filters rejected it (tasks/synth/filters.py, with the reasons);
- ``accepted``: written to ``tasks/synth/<id>.py``, its provenance beside it (``<id>.json``).

Resumable: the manifest is appended row by row and read back on start; seeds it holds are
not composed again, and the accepted tasks are indexed again from their files.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from tasks.synth.compose import Candidate
from tasks.synth.filters import static_problem
from tasks.synth.similarity import SimilarityIndex, exact_key
from tasks.loader import parse_task
from tasks.task import Task

STAGES = ("compose", "static", "duplicate", "near_duplicate", "contamination", "screen", "accepted")


class SynthRun:
    def __init__(self, out: Path, duplicate_similarity: float, kernelbench: SimilarityIndex | None):
        self.out = out
        self.task_dir = out / "tasks" / "synth"
        self.task_dir.mkdir(parents=True, exist_ok=True)
        self.manifest = out / "manifest.jsonl"
        self.kernelbench = kernelbench
        self.accepted = SimilarityIndex(duplicate_similarity)
        self.exact: set[str] = set()
        self.rows = [json.loads(line) for line in self.manifest.read_text().splitlines() if line.strip()] \
            if self.manifest.exists() else []
        self.seeds = {row["seed"] for row in self.rows}
        for row in self.rows:
            path = self.task_dir / f"{Path(row.get('id', '')).name}.py"
            if row["stage"] == "accepted" and path.exists():
                self._index(row["id"], path.read_text())

    @property
    def accepted_count(self) -> int:
        return len(self.accepted)

    def precheck(self, seed: int, candidate: Candidate | None) -> dict | None:
        """The row of a candidate dropped before it runs, or None when it goes on to the screen."""
        if candidate is None:
            return {"seed": seed, "stage": "compose",
                    "reason": "no program: no chain of compatible operators from this seed, or no code block in the policy's answer"}
        row = {"seed": seed, "id": candidate.id, "ops": candidate.provenance.get("ops", [])}
        why = static_problem(candidate.source)
        if why:
            return {**row, "stage": "static", "reason": why}
        copy = self._copy_of(candidate.source)
        if copy:
            return {**row, **copy}
        if self.kernelbench is not None and len(self.kernelbench):
            hit = self.kernelbench.similar(candidate.source)
            if hit:
                return {**row, "stage": "contamination", "closest": hit[0], "similarity": round(hit[1], 3),
                        "reason": f"{hit[1]:.2f} AST-similar to KernelBench {hit[0]}"}
        return None

    def finish(self, seed: int, candidate: Candidate, problem: str, eager_ms: float | None) -> dict:
        """The row of a screened candidate: accepted (and written) unless the screen or a twin accepted meanwhile says no."""
        row = {"seed": seed, "id": candidate.id, "ops": candidate.provenance.get("ops", []), "eager_ms": eager_ms}
        if problem:
            return {**row, "stage": "screen", "reason": problem}
        copy = self._copy_of(candidate.source)  # a twin screened at the same time may have been accepted first
        if copy:
            return {**row, **copy}
        name = Path(candidate.id).name
        (self.task_dir / f"{name}.py").write_text(candidate.source)
        (self.task_dir / f"{name}.json").write_text(json.dumps({**candidate.provenance, "eager_ms": eager_ms}, indent=1))
        self._index(candidate.id, candidate.source)
        if self.kernelbench is not None and len(self.kernelbench):
            closest, similarity = self.kernelbench.closest(candidate.source)
            row.update(closest=closest, similarity=round(similarity, 3))
        return {**row, "stage": "accepted"}

    def record(self, row: dict) -> None:
        self.rows.append(row)
        self.seeds.add(row["seed"])
        with self.manifest.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def counts(self) -> dict[str, int]:
        seen = Counter(row["stage"] for row in self.rows)
        return {stage: seen.get(stage, 0) for stage in STAGES}

    def report(self, extra: dict) -> dict:
        """report.json: candidates per stage, the most common reasons, and the run's facts."""
        reasons = Counter((row["stage"], _reason_class(row.get("reason", ""))) for row in self.rows if row["stage"] != "accepted")
        report = {"candidates": len(self.rows), "stages": self.counts(),
                  "top_reasons": [{"stage": s, "reason": r, "count": n} for (s, r), n in reasons.most_common(20)], **extra}
        (self.out / "report.json").write_text(json.dumps(report, indent=1))
        return report

    def _copy_of(self, source: str) -> dict | None:
        if exact_key(source) in self.exact:
            return {"stage": "duplicate", "reason": "the same program (up to comments and layout) as an accepted task"}
        hit = self.accepted.similar(source)
        if hit:
            return {"stage": "near_duplicate", "closest": hit[0], "similarity": round(hit[1], 3),
                    "reason": f"{hit[1]:.2f} AST-similar to accepted {hit[0]}"}
        return None

    def _index(self, task_id: str, source: str) -> None:
        self.exact.add(exact_key(source))
        self.accepted.add(task_id, source)


def task_of(candidate: Candidate) -> Task:
    """The candidate as a Task, parsed as the loader parses a task file (train and eval will read it so)."""
    return parse_task(candidate.source, candidate.id)


def _reason_class(reason: str) -> str:
    """A reason without its numbers, so the report groups alike ones."""
    return re.sub(r"[-+]?\d[\d.e+-]*", "N", reason)[:120]
