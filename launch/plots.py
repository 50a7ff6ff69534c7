"""The end-of-run plots of a training run, drawn from its metrics.jsonl (launch/metrics.py)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from launch.metrics import read_metrics
from protocol.step_record import MILESTONE_RATES, REWARD, REWARD_MAX, REWARD_MIN

PLOTS = {"reward": "reward.png", "milestones": "milestones.png"}
# Series that share a plot are told apart by style as well as colour: milestone rates are often all
# 0 (or all 1) at once, and three lines on one another would show only the last one drawn.
STYLES = [dict(linestyle="-", marker="o", markersize=9), dict(linestyle="--", marker="s", markersize=6),
          dict(linestyle=":", marker="^", markersize=4)]
MIN_SPAN = 1.0  # the least y range of a reward axis: a flat series stays flat, not noise blown up to fill it
LABEL_SIZE = 9


def write_plots(out_dir: str | os.PathLike) -> list[Path]:
    """Reward and milestone-rate plots from out_dir/metrics.jsonl; returns the files written.

    A plot whose metrics were never logged is not written.
    """
    out_dir = Path(out_dir).expanduser()
    records = read_metrics(out_dir)
    written = []
    for name, figure in (("reward", reward_figure), ("milestones", milestone_figure)):
        fig = figure(records)
        if fig is not None:
            written.append(_save(fig, out_dir / PLOTS[name]))
    return written


def _figure() -> Any:
    # The Figure API without pyplot: no global backend state, safe in any thread, always Agg.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    return fig


def reward_figure(records: list[dict[str, Any]]) -> Any:
    """The mean reward per step, its min-to-max band, the stages; None without rewards."""
    if not any(REWARD in r for r in records):
        return None
    fig = _figure()
    ax = fig.add_subplot()
    steps, mean = _series(records, REWARD)
    ax.plot(steps, mean, marker="o", markersize=4, label="mean", zorder=3)
    band = [r for r in records if r.get(REWARD_MIN) is not None and r.get(REWARD_MAX) is not None]
    if band:
        ax.fill_between([r["step"] for r in band], [r[REWARD_MIN] for r in band], [r[REWARD_MAX] for r in band],
                        alpha=0.2, label="min to max")
    ax.set_ylim(*y_range(mean + [r[k] for r in band for k in (REWARD_MIN, REWARD_MAX)]))
    _finish(ax, records, "episode reward", "reward")
    return fig


def milestone_figure(records: list[dict[str, Any]]) -> Any:
    """The share of each step's episodes reaching each milestone, the stages; None without them."""
    if not any(key in r for r in records for key in MILESTONE_RATES.values()):
        return None
    fig = _figure()
    ax = fig.add_subplot()
    for (label, key), style in zip(MILESTONE_RATES.items(), STYLES):
        steps, rate = _series(records, key)
        if steps:
            ax.plot(steps, rate, label=label, markerfacecolor="none", **style)
    ax.set_ylim(-0.05, 1.05)
    _finish(ax, records, "episodes reaching each milestone", "fraction of episodes")
    return fig


def comparison_figure(runs: dict[str, list[dict[str, Any]]], window: int = 3, threshold: float | None = None,
                      title: str = "") -> Any:
    """Runs side by side (the learning check's synchronous against asynchronous): the mean reward over
    the last ``window`` steps by step and by seconds since the first step's end, ``threshold`` drawn
    across; each run named in the legend with where it first reached the threshold."""
    from matplotlib.ticker import MaxNLocator

    fig = _figure()
    fig.set_size_inches(11, 4.5)
    by_step, by_time = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for k, (label, records) in enumerate(runs.items()):
        steps, rewards = _series(records, REWARD)
        times = [r["time"] - records[0]["time"] for r in records if REWARD in r]
        last = [rewards[max(0, i - window + 1):i + 1] for i in range(len(rewards))]
        smooth = [sum(r) / len(r) for r in last]
        reached = next((i for i in range(window - 1, len(smooth)) if threshold is not None and smooth[i] >= threshold), None)
        if threshold is not None:
            label += (f" ({threshold:g} at step {steps[reached]}, {times[reached]:.0f} s)" if reached is not None
                      else f" ({threshold:g} not reached)")
        style = STYLES[k % len(STYLES)]
        by_step.plot(steps, smooth, label=label, **{**style, "markersize": 4})
        by_time.plot(times, smooth, **{**style, "markersize": 4})
    for ax, xlabel in ((by_step, "step"), (by_time, "seconds since the first step's end")):
        if threshold is not None:
            ax.axhline(threshold, color="grey", linestyle="--", linewidth=1)
        ax.set_ylim(-1.05, 1.05)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    by_step.set_ylabel(f"mean reward over the last {window} steps")
    by_step.xaxis.set_major_locator(MaxNLocator(integer=True))
    by_step.legend(loc="lower right", fontsize=LABEL_SIZE - 1)
    if title:
        fig.suptitle(title)
    return fig


def y_range(values: list[float], min_span: float = MIN_SPAN) -> tuple[float, float]:
    """Limits that hold ``values`` with a margin, at least ``min_span`` apart (matplotlib would
    stretch a constant series over +-0.04, and a flat line would look like data)."""
    lo, hi = min(values, default=0.0), max(values, default=0.0)
    pad = max((hi - lo) * 0.1, (min_span - (hi - lo)) / 2, 0.0)
    return lo - pad, hi + pad


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def stage_spans(records: list[dict[str, Any]]) -> list[tuple[str, int, int]]:
    """(stage, first step, last step) of each run of steps of one stage, in order."""
    spans: list[tuple[str, int, int]] = []
    for r in records:
        stage = r.get("stage")
        if not stage:
            continue
        if spans and spans[-1][0] == stage:
            spans[-1] = (stage, spans[-1][1], r["step"])
        else:
            spans.append((stage, r["step"], r["step"]))
    return spans


def _finish(ax: Any, records: list[dict[str, Any]], title: str, ylabel: str) -> None:
    # Stages as shaded bands named above the plot: a jump in reward at a stage change is the
    # recipe, not noise. Names sit horizontally over their band, a line apart where bands are narrow.
    spans = stage_spans(records)
    steps = [r["step"] for r in records]
    width = (max(steps) - min(steps) + 1) if steps else 1
    axes_pt = ax.get_position().width * ax.figure.get_figwidth() * 72
    names = [stage.replace("_", " ") for stage, _, _ in spans]
    # A name wider than its band (about 0.6 em a character) would run into the next one.
    crowded = any(len(n) * LABEL_SIZE * 0.6 > (last - first + 1) / width * axes_pt for n, (_, first, last) in zip(names, spans))
    for i, ((stage, first, last), name) in enumerate(zip(spans, names)):
        if i % 2:
            ax.axvspan(first - 0.5, last + 0.5, color="grey", alpha=0.08, linewidth=0)
        if i:
            ax.axvline(first - 0.5, color="grey", linestyle=":", linewidth=1)
        ax.annotate(name, ((first + last) / 2, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(0, 4 + (12 if crowded and i % 2 else 0)), textcoords="offset points",
                    fontsize=LABEL_SIZE, ha="center", va="bottom", color="dimgrey", annotation_clip=False)
    if steps:
        ax.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.set_title(title, pad=(34 if crowded else 20) if spans else 6)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=LABEL_SIZE)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    return path
