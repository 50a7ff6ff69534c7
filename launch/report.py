"""Readable renderings of results for people: one evaluation, one episode's transcript, and a
training run's summary."""
from __future__ import annotations

import json
from pathlib import Path

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from launch.metrics import read_metrics
from launch.plots import PLOTS
from protocol.results import EvalResult, Milestone
from protocol.step_record import REWARD, SKIPPED, milestone_rates
from protocol.trajectory import Trajectory

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


def print_transcript(traj: Trajectory, console: Console, max_chars: int = 1500) -> None:
    """The episode as a person reads it: each turn's text, its tool calls, and what came back."""
    from rich.panel import Panel

    turns = iter(enumerate(traj.turns, 1))
    for msg in traj.messages[2:]:  # the system prompt and the task are long and the same every time
        role = msg["role"]
        text = _clip(msg.get("content") or "", max_chars)
        if role == "assistant":
            k, turn = next(turns, (0, None))
            title = f"turn {k}, policy v{turn.version}" if turn else "assistant"
            console.print(Panel(text, title=title, title_align="left", border_style="blue"), markup=False)
        else:
            console.print(Panel(text, title="observation", title_align="left", border_style="dim"), markup=False)
    console.print(episode_line(traj), highlight=False)


def episode_line(traj: Trajectory) -> str:
    """An episode in one line (rich markup): its task, how it ended, its milestone and reward, its cost."""
    style = MILESTONE_STYLE[Milestone(traj.milestone)]
    return (f"[bold]{traj.task_id}[/bold]: {len(traj.turns)} turns, stop [bold]{traj.stop_reason}[/bold], "
            f"[{style}]{Milestone(traj.milestone).name}[/{style}], reward {traj.reward:g}, "
            f"{traj.num_generated} generated / {traj.num_tokens} tokens, {traj.invalid_calls} invalid calls, "
            f"{traj.elisions} elisions, {traj.wall_s:.1f} s" + (f"\nerror: {escape(traj.error)}" if traj.error else ""))


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n... [{len(text) - limit} more characters]"


SHORT = {"correct": "correct", "faster than eager": ">eager", "faster than torch.compile": ">compile"}  # milestone headers


def print_training_summary(out_dir: str | Path, console: Console, env_kind: str = "kernel") -> None:
    """What a finished ``cuda-agent train`` did, stage by stage, and where its results are."""
    out = Path(out_dir)
    recipe_path = out / "recipe.json"
    recipe = json.loads(recipe_path.read_text()) if recipe_path.exists() else {}
    records = read_metrics(out)
    milestones = milestone_rates(env_kind)
    headers = [SHORT[label] for label in milestones]
    # Narrow enough for an 80-column log; the caption spells out the short headers.
    table = Table(title=f"training summary: {out}", box=box.SIMPLE, show_edge=False, collapse_padding=True,
                  caption=f"reward: mean; {', '.join(headers)}: share of episodes reaching each milestone; "
                          "tokens: trained by the learner; min: the stage's wall time")
    for col in ("stage", "steps", "eps", "reward", *headers, "tokens", "min"):
        table.add_column(col, justify="left" if col == "stage" else "right", no_wrap=True, min_width=len(col))
    for stage in dict.fromkeys(r["stage"] for r in records if r.get("stage")):
        rows = [r for r in records if r.get("stage") == stage]
        table.add_row(*_summary_row(stage, rows, recipe.get("stage_s", {}).get(stage), milestones))
    console.print(table)
    for stage in dict.fromkeys(r["stage"] for r in records if r.get("stage")):
        # The curve itself, not only its mean: whether the reward rose is what a learning run shows.
        curve = [r[REWARD] for r in records if r.get("stage") == stage and r.get(REWARD) is not None]
        if 1 < len(curve) <= 50:
            console.print(f"{stage} reward by step: " + " ".join(f"{x:+.2f}" for x in curve), markup=False)
    for r in records:
        if r.get(SKIPPED):
            console.print(f"step {r['step']} ({r.get('stage', '')}) trained nothing: {r[SKIPPED]}", markup=False)
    for name in PLOTS.values():
        if (out / name).exists():
            console.print(f"plot: {out / name}")
    if recipe.get("policy"):
        console.print(f"policy: {recipe['policy']}" + (f"\ncritic: {recipe['critic']}" if recipe.get("critic") else ""))
    console.print(f"metrics: {out / 'metrics.jsonl'} (TensorBoard: tensorboard --logdir {out / 'tb'})")


def _summary_row(stage: str, rows: list[dict], wall_s: float | None, milestones: dict[str, str]) -> list[str]:
    """One stage's cells: reward and milestone rates weighted by each step's episodes."""
    episodes = sum(r.get("episodes") or 0 for r in rows)

    def mean(key: str) -> float | None:
        return sum((r.get(key) or 0.0) * (r.get("episodes") or 0) for r in rows) / episodes if episodes else None

    rates = [mean(key) for key in milestones.values()]
    tokens = [r["learner/tokens"] for r in rows if r.get("learner/tokens") is not None]
    return [stage, str(len(rows)), str(episodes), _number(mean(REWARD), "+.2f"),
            *(_number(None if rate is None else 100 * rate, ".0f", "%") for rate in rates),
            str(int(sum(tokens))) if tokens else "-", _number(None if wall_s is None else wall_s / 60, ".1f")]


def _number(value: float | None, spec: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"
