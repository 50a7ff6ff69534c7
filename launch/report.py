"""Readable renderings of results for people: one evaluation now; evaluation sweeps later."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from env_pool.results import EvalResult, Milestone

MILESTONE_STYLE = {
    Milestone.FAIL: "red",
    Milestone.CORRECT: "yellow",
    Milestone.FASTER_THAN_EAGER: "cyan",
    Milestone.FASTER_THAN_COMPILE: "green",
}


def print_eval_result(result: EvalResult, console: Console) -> None:
    style = MILESTONE_STYLE[result.milestone]
    console.print(f"[bold]{result.task_id}[/bold] ({result.backend}): [{style}]{result.milestone.name}[/{style}], reward {result.reward:g}"
                  + (f", failure: {result.failure}" if result.failure else ""))
    if result.message:
        console.print(result.message, markup=False, highlight=False)
    table = Table(show_header=True)
    for col in ("what", "median ms", "IQR ms", "speedup"):
        table.add_column(col)
    for name, timing, speedup in (("eager reference", result.eager, None), ("torch.compile reference", result.compiled, None),
                                  ("candidate", result.candidate, result.speedup_vs_eager)):
        if timing is not None:
            extra = "" if speedup is None else f"{speedup:.2f}x eager, {result.speedup_vs_compile:.2f}x compile"
            table.add_row(name, f"{timing.median_ms:.3f}", f"{timing.iqr_ms:.3f}", extra)
    if result.checks:
        passed = sum(c.passed for c in result.checks)
        table.add_row("correctness", f"{passed}/{len(result.checks)} input sets", "", "")
    table.add_row("compile", f"{result.compile_s:.1f} s" + (" (cached)" if result.cache_hit else ""), "", "")
    table.add_row("wall", f"{result.wall_s:.1f} s", "", "")
    console.print(table)
