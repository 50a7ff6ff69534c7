"""A synthesis run's bookkeeping: which candidates each stage dropped and why, and the accepted task folder.

Stages, in order (each candidate ends in exactly one, recorded as one manifest row):
- ``compose``: no chain could be built from the seed;
- ``static``: it does not parse, lacks an entry point, or calls something stochastic;
- ``duplicate``: its normalised AST, or its traced computation (tasks/synth/trace.py), equals an accepted task's;
- ``near_duplicate``: its AST similarity to an accepted task is at or above the threshold;
- ``contamination``: its traced computation equals or contains a KernelBench problem's, scoring
  at or above the threshold (tasks/synth/contamination.py; the row names the closest problem);
- ``screen``: the dynamic filters rejected it (tasks/synth/filters.py; the row's ``filters`` name
  each one that did, ``reason`` says why);
- ``accepted``: written to ``tasks/synth/<id>.py``, its provenance beside it (``<id>.json``: the
  operators, their trace, the nearest KernelBench problem and its score, the eager time).

Every row that got so far carries the candidate's trace and nearest KernelBench problem, so the
quality report (tasks/synth/quality.py) can show the score of what was accepted and of what was not.

Resumable: the manifest is appended row by row and read back on start; seeds it holds are
not composed again, and the accepted tasks are indexed again from their files.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from protocol.records import RecordWriter, read_records
from tasks.loader import parse_task
from tasks.screen import ScreenResult
from tasks.synth.catalogue import category
from tasks.synth.compose import Candidate
from tasks.synth.contamination import KernelBenchTraces
from tasks.synth.filters import static_problem
from tasks.synth.quality import quality_report, render_html
from tasks.synth.similarity import SimilarityIndex, exact_key
from tasks.synth.trace import trace_problem
from tasks.task import Task, build_problem

STAGES = ("compose", "static", "duplicate", "near_duplicate", "contamination", "screen", "accepted")


class SynthRun:
    def __init__(self, out: Path, duplicate_similarity: float, kernelbench: KernelBenchTraces | None,
                 contamination_score: float = 0.75):
        self.out = out
        self.contamination_score = contamination_score
        self.task_dir = out / "tasks" / "synth"
        self.task_dir.mkdir(parents=True, exist_ok=True)
        self.manifest = out / "manifest.jsonl"
        self.kernelbench = kernelbench
        self.accepted = SimilarityIndex(duplicate_similarity)
        self.exact: set[str] = set()
        self.computations: dict[tuple[str, ...], str] = {}  # an accepted task's trace -> its id
        self.rows = read_records(self.manifest)
        self.writer = RecordWriter(self.manifest)  # appended row by row, a torn last row cut off first
        self.seeds = {row["seed"] for row in self.rows}
        for row in self.rows:
            path = self.task_dir / f"{Path(row.get('id', '')).name}.py"
            if row["stage"] == "accepted" and path.exists():
                self._index(row["id"], path.read_text(), row.get("trace"))

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
        screened = self._traced(candidate)
        copy = self._same_computation(screened.get("trace"))
        if copy:
            return {**row, **screened, **copy}
        if screened.get("score", 0.0) >= self.contamination_score:
            return {**row, **screened, "stage": "contamination",
                    "reason": f"its traced computation scores {screened['score']:.2f} against KernelBench "
                              f"{screened['closest']} (equal or contained at >= {self.contamination_score})"}
        candidate.provenance.update(screened)  # carried to the screen's row and the task's provenance
        return None

    def _traced(self, candidate: Candidate) -> dict:
        """The candidate's trace, and its nearest KernelBench problem when KernelBench was given (only an
        error when it does not trace)."""
        try:
            tokens = trace_problem(build_problem(task_of(candidate), "cpp"))
        except Exception as err:  # noqa: BLE001 - a program that cannot run is the screen's to reject, with its reason
            return {"trace_error": f"{type(err).__name__}: {str(err)[:200]}"}
        if self.kernelbench is None or not len(self.kernelbench):
            return {"trace": tokens}
        nearest = self.kernelbench.nearest(tokens)
        return {"trace": tokens, "closest": nearest.problem, "score": round(nearest.score, 3)}

    def _same_computation(self, trace: list[str] | None) -> dict | None:
        """A duplicate's stage and reason when an accepted task's trace is ``trace``: the same operators
        on other shapes (sinh on a flat input and on an image, in a 200-task run) are one kernel to write."""
        twin = self.computations.get(tuple(trace)) if trace is not None else None
        if twin is None:
            return None
        return {"stage": "duplicate", "closest": twin,
                "reason": f"the same traced computation ({' '.join(trace) or 'none'}) as accepted {twin}"}

    def finish(self, seed: int, candidate: Candidate, screen: ScreenResult) -> dict:
        """The row of a screened candidate: accepted (and written) unless the screen or a twin accepted meanwhile says no."""
        facts = {k: candidate.provenance[k] for k in ("trace", "closest", "score", "eager_ms_sized", "target_ms",
                                                       "batch_cpp", "batch_cuda") if k in candidate.provenance}
        ops = candidate.provenance.get("ops", [])
        row = {"seed": seed, "id": candidate.id, "ops": ops, "categories": [category(op) for op in ops],
               "eager_ms": screen.eager_ms, **facts}
        if screen.problems:
            return {**row, "stage": "screen", "filters": screen.filters, "reason": "; ".join(screen.problems)}
        # a twin screened at the same time may have been accepted first
        copy = self._copy_of(candidate.source) or self._same_computation(candidate.provenance.get("trace"))
        if copy:
            return {**row, **copy}
        name = Path(candidate.id).name
        (self.task_dir / f"{name}.py").write_text(candidate.source)
        (self.task_dir / f"{name}.json").write_text(json.dumps(
            {**candidate.provenance, "categories": row["categories"], "eager_ms": screen.eager_ms,
             "distinct": [round(d, 4) for d in screen.distinct]}, indent=1))
        self._index(candidate.id, candidate.source, candidate.provenance.get("trace"))
        return {**row, "stage": "accepted"}

    def record(self, row: dict) -> None:
        self.rows.append(row)
        self.seeds.add(row["seed"])
        self.writer.write(row)

    def counts(self) -> dict[str, int]:
        seen = Counter(row["stage"] for row in self.rows)
        return {stage: seen.get(stage, 0) for stage in STAGES}

    def report(self, extra: dict) -> dict:
        """report.json (and report.html): candidates per stage and per filter with an example of each, the
        most common reasons, the accepted set's make-up, and the run's facts."""
        reasons = Counter((row["stage"], _reason_class(row.get("reason", ""))) for row in self.rows if row["stage"] != "accepted")
        report = {"candidates": len(self.rows), "stages": self.counts(), **quality_report(self.rows),
                  "top_reasons": [{"stage": s, "reason": r, "count": n} for (s, r), n in reasons.most_common(20)], **extra}
        (self.out / "report.json").write_text(json.dumps(report, indent=1))
        (self.out / "report.html").write_text(render_html(report))
        return report

    def _copy_of(self, source: str) -> dict | None:
        if exact_key(source) in self.exact:
            return {"stage": "duplicate", "reason": "the same program (up to comments and layout) as an accepted task"}
        hit = self.accepted.similar(source)
        if hit:
            return {"stage": "near_duplicate", "closest": hit[0], "similarity": round(hit[1], 3),
                    "reason": f"{hit[1]:.2f} AST-similar to accepted {hit[0]}"}
        return None

    def _index(self, task_id: str, source: str, trace: list[str] | None) -> None:
        self.exact.add(exact_key(source))
        self.accepted.add(task_id, source)
        if trace is not None:
            self.computations.setdefault(tuple(trace), task_id)


def task_of(candidate: Candidate) -> Task:
    """The candidate as a Task, parsed as the loader parses a task file (train and eval will read it so)."""
    return parse_task(candidate.source, candidate.id)


def _reason_class(reason: str) -> str:
    """A reason without its numbers, so the report groups alike ones."""
    return re.sub(r"[-+]?\d[\d.e+-]*", "N", reason)[:120]
