"""What a tool call gives back (``ToolResult``), and its observation: the text the model reads.

Observations are short and in a fixed layout a small model can learn: the verdict first, then
the details that help (the first compiler errors, the mismatch, the speedups, the guard that
fired), truncated to ``observation_max_chars`` with a note saying what was cut.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol.results import EvalResult, Milestone

MESSAGE_MAX_CHARS = 1500  # of an evaluation's message: the first errors say what to fix; the rest is noise


@dataclass
class ToolResult:
    text: str  # the observation the model reads
    valid: bool  # False: unknown tool or bad arguments (the text explains the expected form)
    summary: str  # one line for the turn record
    ends_episode: bool = False  # submit
    eval: EvalResult | None = None  # the evaluation this call ran (compile, verify, profile, submit)
    reward: float | None = None  # its milestone reward; None when the call reaches no milestone


_MILESTONE_TEXT = {
    Milestone.FAIL: "FAIL",
    Milestone.CORRECT: "CORRECT (not faster than eager PyTorch)",
    Milestone.FASTER_THAN_EAGER: "FASTER THAN EAGER (not yet >5% faster than torch.compile)",
    Milestone.FASTER_THAN_COMPILE: "FASTER THAN TORCH.COMPILE (the target)",
}


def format_eval(result: EvalResult, tool: str, kernel_source: str = "kernel.cpp") -> str:
    """An evaluation as the agent reads it: verdict, then what to fix or how fast it is."""
    if result.failure is not None:
        lines = [f"{tool}: FAILED ({result.failure})", _clip(result.message, MESSAGE_MAX_CHARS)]
        lines += [f"violation [{v.guard}]: {v.reason}" for v in result.violations if v.reason not in result.message]
        return "\n".join(lines)
    if tool == "compile":
        how = "cache hit" if result.cache_hit else f"{result.compile_s:.1f} s"
        return f"compile: OK ({how})" if result.compile_s or result.cache_hit else \
            f"compile: OK (no {kernel_source} to compile; model_new.py is imported when you verify)"
    lines = [f"{tool}: {_MILESTONE_TEXT[result.milestone]} (reward {result.reward:g})"]
    if result.checks:
        worst = max((c.max_abs_error or 0.0) for c in result.checks)
        lines.append(f"correctness: {sum(c.passed for c in result.checks)}/{len(result.checks)} input sets passed, "
                     f"max abs error {worst:.2e}")
    if result.candidate is not None:
        lines.append(_timing_line(result))
    return "\n".join(lines)


def _timing_line(result: EvalResult) -> str:
    parts = [f"time: yours {result.candidate.median_ms:.3f} ms"]
    if result.eager is not None:
        parts.append(f"eager {result.eager.median_ms:.3f} ms (speedup {result.speedup_vs_eager:.2f}x{_within(result.eager_interval)})")
    if result.compiled is not None:
        parts.append(f"torch.compile {result.compiled.median_ms:.3f} ms "
                     f"(speedup {result.speedup_vs_compile:.2f}x{_within(result.compile_interval)})")
    noise = max(t.noise for t in (result.candidate, result.eager, result.compiled) if t is not None)
    return ", ".join(parts) + f"; noise {100 * noise:.0f}%"


def _within(interval: list[float]) -> str:
    return f", 95% interval {interval[0]:.2f}-{interval[1]:.2f}x" if interval else ""


def eval_summary(result: EvalResult, tool: str) -> str:
    """An evaluation in one line, for the turn record."""
    if result.failure is not None:
        first = (result.message.strip().splitlines() or [""])[0]
        return f"{result.failure}: {first[:120]}"
    if tool == "compile":
        return "compiled"
    speed = f", {result.speedup_vs_eager:.2f}x eager, {result.speedup_vs_compile:.2f}x compile" \
        if result.speedup_vs_eager is not None and result.speedup_vs_compile is not None else ""
    return f"{result.milestone.name}{speed}"


def format_profile(report: dict[str, Any]) -> str:
    """A reference profile (env_pool/reference_profile.py) as the agent reads it."""
    if not report.get("ok"):
        return f"profiling the reference failed: {_clip(str(report.get('error', 'unknown error')), MESSAGE_MAX_CHARS)}"
    lines = [f"reference {report['task_id']} on {report['device']}",
             f"inputs: {', '.join(report['inputs']) or 'none'}"]
    if report.get("init_inputs"):
        lines.append(f"init inputs: {', '.join(report['init_inputs'])}")
    lines.append(f"eager time: {report['eager_ms']:.3f} ms (median of {report['repetitions']}, "
                 f"IQR {report['eager_iqr_ms']:.3f} ms)")
    lines.append("top operators by self time (under the profiler):")
    lines.append(f"  {'self %':>7}  {'ms/run':>8}  {'calls':>5}  name")
    for op in report.get("top_ops", []):
        lines.append(f"  {op['self_pct']:6.1f}%  {op['self_ms']:8.3f}  {op['calls']:5.3g}  {op['name']}")
    return "\n".join(lines)


def truncate(text: str, limit: int, hint: str = "") -> str:
    """``text`` within ``limit`` characters: the head, and a note saying how much was cut."""
    if len(text) <= limit:
        return text
    note = f"\n[... {{}} more characters cut{'; ' + hint if hint else ''}]"
    keep = max(0, limit - len(note.format(len(text))))
    return text[:keep] + note.format(len(text) - keep)


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + f" [... {len(text) - limit} characters cut]"
