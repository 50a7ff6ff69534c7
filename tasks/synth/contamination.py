"""The contamination screen: a candidate whose traced computation equals or contains a KernelBench problem's is dropped.

Both sides are traced (tasks/synth/trace.py) to operator tokens. The score of a candidate C
against a problem K is the longest common subsequence of their tokens over the longer trace,
``LCS(C, K) / max(|C|, |K|)``: 1.0 when they compute the same chain (a ``tanh`` task and
``level1/22_Tanh``), ``|K| / |C|`` when C is K with other operators around it, low when they
share an operator or two in a longer chain (a five-operator chain that applies ``tanh`` among
others scores 0.2 against ``22_Tanh``). A candidate at or above ``synth.contamination_score``
against some problem is rejected; the nearest problem and its score are kept for every task.

KernelBench's traces are cached in a JSON file keyed by each problem's text, the torch version
and the tracer's (TRACE_VERSION) (tracing level 3 on the meta device takes minutes: its RNNs run step by step there).
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tasks.synth.trace import TRACE_VERSION, trace_problem

LEVELS = ("level1", "level2", "level3")


@dataclass
class Nearest:
    """A candidate's closest KernelBench problem."""

    problem: str = ""  # "level1/22_Tanh"; "" when nothing shares an operator
    score: float = 0.0  # LCS over the longer trace, 0..1
    tokens: list[str] = field(default_factory=list)  # the problem's trace


@dataclass
class KernelBenchTraces:
    """Each KernelBench problem's operator tokens, by "levelN/stem"; the problems that could not be traced, with why."""

    traces: dict[str, list[str]] = field(default_factory=dict)
    untraced: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.traces)

    def nearest(self, tokens: list[str]) -> Nearest:
        """The problem with the highest score (the first by name among equals)."""
        best = Nearest()
        have = Counter(tokens)
        # Highest possible score first, so that the exact LCS runs only where it could beat the best so far.
        bounds = sorted(((_bound(have, len(tokens), trace), name) for name, trace in self.traces.items()),
                        key=lambda b: (-b[0], b[1]))
        for bound, name in bounds:
            if bound <= best.score or bound == 0:
                break
            score = similarity(tokens, self.traces[name])
            if score > best.score:
                best = Nearest(name, score, self.traces[name])
        return best


def similarity(a: list[str], b: list[str]) -> float:
    """LCS(a, b) / max(|a|, |b|): 1 for equal traces, |b|/|a| when a contains b in order."""
    if not a or not b:
        return 0.0
    return _lcs(a, b) / max(len(a), len(b))


def _lcs(a: list[str], b: list[str]) -> int:
    if len(a) < len(b):
        a, b = b, a
    row = [0] * (len(b) + 1)
    for x in a:
        diagonal = 0
        for j, y in enumerate(b, 1):
            diagonal, row[j] = row[j], diagonal + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def _bound(have: Counter, length: int, trace: list[str]) -> float:
    """An upper bound on similarity(): the operators in common, counted, over the longer trace."""
    if not length or not trace:
        return 0.0
    common = sum((have & Counter(trace)).values())
    return common / max(length, len(trace))


def kernelbench_traces(root: Path, cache: Path | None = None) -> KernelBenchTraces:
    """Levels 1-3 under ``root`` traced (read in place; empty when absent), through the cache file when given."""
    from tasks.loader import parse_task
    from tasks.task import build_problem

    stored = _read(cache)
    found = KernelBenchTraces()
    changed = False
    for level in LEVELS:
        for path in sorted((root / level).glob("*.py")) if (root / level).is_dir() else []:
            name, text = f"{level}/{path.stem}", path.read_text()
            key = hashlib.sha256(f"{torch.__version__}\n{TRACE_VERSION}\n{text}".encode()).hexdigest()
            entry = stored.get(name)
            if entry is None or entry.get("key") != key:
                try:
                    entry = {"key": key, "tokens": trace_problem(build_problem(parse_task(text, name), "cpp"))}
                except Exception as err:  # noqa: BLE001 - one problem that does not run is named, never the run's end
                    entry = {"key": key, "error": f"{type(err).__name__}: {str(err)[:200]}"}
                stored[name], changed = entry, True
            if "tokens" in entry:
                found.traces[name] = entry["tokens"]
            else:
                found.untraced[name] = entry["error"]
    if cache is not None and changed:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp")
        tmp.write_text(json.dumps(stored))
        tmp.replace(cache)
    return found


def _read(cache: Path | None) -> dict:
    if cache is None or not cache.exists():
        return {}
    try:
        return json.loads(cache.read_text())
    except (OSError, ValueError):  # a damaged cache is traced again
        return {}
