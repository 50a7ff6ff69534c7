"""The quality report of a synthesis run: what each filter rejected (with an example) and what the accepted set is made of.

Read from the manifest's rows (tasks/synth/pipeline.py), so a stopped run's report is as
complete as its manifest. A candidate the screen rejects counts under every filter that fired
on it (the row's ``filters``); the stages before the screen (static, duplicate, near_duplicate,
contamination) each count their own rows. ``render_html`` draws the same figures as a page
(report.html beside report.json).
"""
from __future__ import annotations

import html
import statistics
from collections import Counter

from tasks.screen import FILTERS

STAGE_FILTERS = ("compose", "static", "duplicate", "near_duplicate", "contamination")
EAGER_BINS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0)  # ms edges of the eager-time histogram


def quality_report(rows: list[dict]) -> dict:
    """{"filters": per filter its rejections and one example, "accepted_set": counts, categories, times, nearest problems}."""
    return {"filters": _filters(rows), "accepted_set": _accepted(rows)}


def _filters(rows: list[dict]) -> dict:
    out = {}
    for name in (*STAGE_FILTERS, *FILTERS, "screen_error"):
        hits = [r for r in rows if _rejected_by(r, name)]
        example = hits[0] if hits else None
        out[name] = {"rejected": len(hits), "example": None if example is None else {
            "id": example.get("id", f"seed {example['seed']}"), "ops": example.get("ops", []),
            "reason": str(example.get("reason", ""))[:400],
            **({"closest": example["closest"], "score": example.get("score")} if name == "contamination" else {})}}
    return out


def _rejected_by(row: dict, name: str) -> bool:
    if name in STAGE_FILTERS:
        return row["stage"] == name
    if row["stage"] != "screen":
        return False
    fired = row.get("filters") or []
    return name in fired if name != "screen_error" else not fired  # a screen that broke names no filter


def _accepted(rows: list[dict]) -> dict:
    kept = [r for r in rows if r["stage"] == "accepted"]
    times = sorted(r["eager_ms"] for r in kept if r.get("eager_ms") is not None)
    scores = sorted(r["score"] for r in kept if r.get("score") is not None)
    return {
        "tasks": len(kept),
        "operator_counts": dict(sorted(Counter(len(r.get("ops", [])) for r in kept).items())),
        "categories": dict(Counter(c for r in kept for c in r.get("categories", [])).most_common()),
        "operators": dict(Counter(op for r in kept for op in r.get("ops", [])).most_common(15)),
        "eager_ms": _spread(times),
        "eager_ms_histogram": _histogram(times),
        "kernelbench_score": _spread(scores),
        "nearest_problems": dict(Counter(r["closest"] for r in kept if r.get("closest")).most_common(10)),
    }


def _spread(values: list[float]) -> dict:
    if not values:
        return {}
    def at(q: float) -> float:
        return round(values[min(len(values) - 1, int(q * len(values)))], 3)
    return {"min": round(values[0], 3), "p10": at(0.1), "median": round(statistics.median(values), 3), "p90": at(0.9),
            "max": round(values[-1], 3)}


def _histogram(times: list[float]) -> dict:
    edges = (0.0, *EAGER_BINS, float("inf"))
    return {f"{lo:g}-{hi:g}": sum(lo <= t < hi for t in times) for lo, hi in zip(edges, edges[1:])}


def render_html(report: dict) -> str:
    """report.json as a page: stages, each filter with its example, the accepted set's make-up."""
    def table(header: list[str], rows: list[list]) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
        return f"<table><tr>{head}</tr>{body}</table>"

    def bars(counts: dict) -> str:
        top = max(counts.values(), default=0) or 1
        return table(["", "count", ""], [[k, v, "#" * round(40 * v / top)] for k, v in counts.items()])

    filters = report.get("filters", {})
    accepted = report.get("accepted_set", {})
    facts = {k: v for k, v in report.items() if not isinstance(v, (dict, list))}
    style = ("body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse;margin:8px 0}"
             "td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px;vertical-align:top}")
    return "\n".join([
        "<!doctype html><html><head><meta charset='utf-8'><title>synthesis report</title>",
        f"<style>{style}</style></head><body><h1>Synthesis report</h1>",
        table(["fact", "value"], [[k, v] for k, v in facts.items()]),
        "<h2>Candidates per stage</h2>", bars(report.get("stages", {})),
        "<h2>Per filter: rejected, with an example</h2>",
        table(["filter", "rejected", "example", "ops", "why"],
              [[name, f["rejected"], (f["example"] or {}).get("id", ""), " -> ".join((f["example"] or {}).get("ops", [])),
                (f["example"] or {}).get("reason", "")] for name, f in filters.items()]),
        f"<h2>Accepted set ({accepted.get('tasks', 0)} tasks)</h2>",
        "<h3>Operators per task</h3>", bars({str(k): v for k, v in accepted.get("operator_counts", {}).items()}),
        "<h3>Categories (operator occurrences)</h3>", bars(accepted.get("categories", {})),
        "<h3>Eager time, ms</h3>", table(list(accepted.get("eager_ms", {})), [list(accepted.get("eager_ms", {}).values())]),
        bars(accepted.get("eager_ms_histogram", {})),
        "<h3>Nearest KernelBench problem: score</h3>",
        table(list(accepted.get("kernelbench_score", {})), [list(accepted.get("kernelbench_score", {}).values())]),
        bars(accepted.get("nearest_problems", {})),
        "</body></html>",
    ])
