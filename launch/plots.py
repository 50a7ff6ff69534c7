"""The end-of-run plots of a training run, drawn from its metrics.jsonl (launch/metrics.py)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from launch.metrics import MILESTONE_RATES, REWARD, REWARD_MAX, REWARD_MIN, read_metrics

PLOTS = {"reward": "reward.png", "milestones": "milestones.png"}


def write_plots(out_dir: str | os.PathLike) -> list[Path]:
    """Reward and milestone-rate plots from out_dir/metrics.jsonl; returns the files written.

    A plot whose metrics were never logged is not written.
    """
    # The Figure API without pyplot: no global backend state, safe in any thread, always Agg.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out_dir = Path(out_dir).expanduser()
    records = read_metrics(out_dir)
    written = []
    if any(REWARD in r for r in records):
        fig = Figure(figsize=(7, 4), dpi=120)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        steps, mean = _series(records, REWARD)
        ax.plot(steps, mean, marker="o", markersize=3, label="mean")
        band = [r for r in records if r.get(REWARD_MIN) is not None and r.get(REWARD_MAX) is not None]
        if band:
            ax.fill_between([r["step"] for r in band], [r[REWARD_MIN] for r in band], [r[REWARD_MAX] for r in band],
                            alpha=0.2, label="min to max")
        _finish(ax, records, "episode reward", "reward")
        written.append(_save(fig, out_dir / PLOTS["reward"]))
    if any(key in r for r in records for key in MILESTONE_RATES.values()):
        fig = Figure(figsize=(7, 4), dpi=120)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for label, key in MILESTONE_RATES.items():
            steps, rate = _series(records, key)
            if steps:
                ax.plot(steps, rate, marker="o", markersize=3, label=label)
        ax.set_ylim(-0.02, 1.02)
        _finish(ax, records, "episodes reaching each milestone", "fraction of episodes")
        written.append(_save(fig, out_dir / PLOTS["milestones"]))
    return written


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def _finish(ax: Any, records: list[dict[str, Any]], title: str, ylabel: str) -> None:
    # Stage boundaries as vertical lines: a jump in reward at a stage change is the recipe, not noise.
    previous = None
    for r in records:
        stage = r.get("stage")
        if stage and stage != previous:
            ax.axvline(r["step"], color="grey", linestyle=":", linewidth=1)
            ax.annotate(stage, (r["step"], 1.0), xycoords=("data", "axes fraction"), fontsize=7,
                        rotation=90, va="top", ha="left", color="grey")
        previous = stage or previous
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    return path
