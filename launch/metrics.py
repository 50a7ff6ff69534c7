"""Training metrics: one record per step to JSONL and TensorBoard, plots at the end, live progress.

A record is a flat mapping of ``group/name`` to a number (nested dicts are flattened with "/"),
keyed by a global step that keeps counting across the stages of the recipe. The names below
are the ones the plots and the progress display read; the driver may log any others.

Resuming: a run restarted from the checkpoint of step N opens the sink with ``resume_step=N``.
Records after N came from weights that were lost, so they are removed from metrics.jsonl and
TensorBoard is told to purge them (``purge_step``); the rerun writes those steps afresh, once.
Without ``resume_step`` the sink continues after the last step on disk and skips any step
already there.
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

log = logging.getLogger("cuda_agent.metrics")

METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"
PLOTS = {"reward": "reward.png", "milestones": "milestones.png"}

REWARD = "reward/mean"
REWARD_MIN = "reward/min"
REWARD_MAX = "reward/max"
MILESTONE_RATES = {  # fraction of the step's episodes that reached at least this milestone
    "correct": "milestone/correct",
    "faster than eager": "milestone/faster_than_eager",
    "faster than torch.compile": "milestone/faster_than_compile",
}
TOKENS_PER_S = "throughput/tokens_per_s"
ENV_QUEUE = "env/queue_depth"
BUFFER_DEPTH = "buffer/depth"
STALENESS = "buffer/staleness_mean"


def episode_metrics(episodes: Iterable[Any]) -> dict[str, float]:
    """Reward and milestone rates of a step's episodes (anything with ``reward`` and ``milestone``)."""
    episodes = list(episodes)
    if not episodes:
        return {"episodes": 0}
    rewards = [float(e.reward) for e in episodes]
    out = {"episodes": len(episodes), REWARD: sum(rewards) / len(rewards), REWARD_MIN: min(rewards), REWARD_MAX: max(rewards)}
    for level, key in enumerate(MILESTONE_RATES.values(), start=1):
        out[key] = sum(int(e.milestone) >= level for e in episodes) / len(episodes)
    return out


def flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings become ``outer/inner`` keys; non-finite floats become None (JSON has no NaN)."""
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}/"))
        elif isinstance(value, (bool, str)) or value is None:
            flat[name] = value
        elif isinstance(value, (int, float)) or hasattr(value, "__float__"):
            number = value if isinstance(value, int) else float(value)
            flat[name] = number if isinstance(number, int) or math.isfinite(number) else None
        else:
            raise TypeError(f"metric {name!r} is a {type(value).__name__}; log numbers, strings, bools or mappings of them")
    return flat


def read_metrics(out_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of out_dir/metrics.jsonl in order; a torn last line (a crash mid-write) is skipped."""
    path = Path(out_dir) / METRICS_FILE
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
    return records


class MetricsSink:
    """Writes step records to metrics.jsonl and TensorBoard under ``out_dir``."""

    def __init__(self, out_dir: str | os.PathLike, jsonl: bool = True, tensorboard: bool = True,
                 resume_step: int | None = None):
        self.out_dir = Path(out_dir).expanduser()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.last_step = self._recover(resume_step) if jsonl else resume_step
        self._file = open(self.out_dir / METRICS_FILE, "a", buffering=1) if jsonl else None  # line-buffered
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if self.last_step is None else self.last_step + 1
            self._tb = SummaryWriter(str(self.out_dir / TB_DIR), purge_step=purge)

    @classmethod
    def from_config(cls, logging_cfg: Any, resume_step: int | None = None) -> "MetricsSink":
        return cls(logging_cfg.out_dir, logging_cfg.jsonl, logging_cfg.tensorboard, resume_step)

    def _recover(self, resume_step: int | None) -> int | None:
        records = read_metrics(self.out_dir)
        kept = records if resume_step is None else [r for r in records if r["step"] <= resume_step]
        path = self.out_dir / METRICS_FILE
        # A torn last line (a crash mid-write) would glue onto the next record: rewrite without it.
        if path.exists() and (len(kept) != len(records) or _has_torn_line(path)):
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
            os.replace(tmp, path)  # atomic: a crash here leaves the old file or the new one
            if resume_step is not None:
                log.info("metrics: resumed at step %d, removed %d later record(s)", resume_step, len(records) - len(kept))
        return resume_step if resume_step is not None else max((r["step"] for r in kept), default=None)

    def log(self, step: int, metrics: Mapping[str, Any], stage: str | None = None) -> bool:
        """Write one step's record; False (and nothing written) for a step already logged."""
        if self.last_step is not None and step <= self.last_step:
            log.warning("metrics: step %d is already logged (last %d); skipped", step, self.last_step)
            return False
        flat = flatten(metrics)
        record = {"step": step, "time": time.time(), **({"stage": stage} if stage else {}), **flat}
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for name, value in flat.items():
                if isinstance(value, (int, float)):  # bools are ints: logged as 0/1
                    self._tb.add_scalar(name, float(value), step)
            self._tb.flush()
        self.last_step = step
        return True

    def log_side(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Scalars of a side measurement (a held-out sweep) to TensorBoard at ``step``, which may be
        logged already: they are not a step record (launch/heldout.py keeps their JSONL)."""
        if self._tb is not None:
            for name, value in flatten(metrics).items():
                if isinstance(value, (int, float)):
                    self._tb.add_scalar(name, float(value), step)
            self._tb.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> "MetricsSink":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _has_torn_line(path: Path) -> bool:
    text = path.read_text()
    return bool(text) and not text.endswith("\n")


# --------------------------------------------------------------------------- plots


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


# --------------------------------------------------------------------------- live progress


class ProgressDisplay:
    """The training run on the terminal: a live panel on a TTY, one log line per step otherwise.

    Shows the step, the reward and milestone rates, tokens/s, the env queue depth and the
    buffer's staleness, read from the same metric names the sink writes.
    """

    def __init__(self, total_steps: int, stage: str = "", enabled: bool = True, console: Any = None):
        from rich.console import Console

        self.total_steps = total_steps
        self.stage = stage
        self.console = console or Console(stderr=True)
        # Not a terminal (CI, a log file, a Ray job): live redraws would fill the log with frames.
        self.live_mode = enabled and self.console.is_terminal
        self._live = None
        self._started = time.monotonic()
        self.logger = logging.getLogger("cuda_agent.progress")

    def __enter__(self) -> "ProgressDisplay":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        if self.live_mode and self._live is None:
            from rich.live import Live

            self._live = Live(self._render(0, {}), console=self.console, refresh_per_second=4, transient=False)
            self._live.start()

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def update(self, step: int, metrics: Mapping[str, Any], stage: str | None = None) -> None:
        self.stage = stage or self.stage
        flat = flatten(metrics)
        if self._live is not None:
            self._live.update(self._render(step, flat), refresh=True)
        else:
            self.logger.info(self.line(step, flat))

    def line(self, step: int, flat: Mapping[str, Any]) -> str:
        """The plain one-line form of a step."""
        parts = [f"step {step}/{self.total_steps}" + (f" [{self.stage}]" if self.stage else "")]
        parts.append(f"reward {_fmt(flat.get(REWARD))}")
        parts.append(" ".join(f"{label.split()[-1]} {_pct(flat.get(key))}" for label, key in MILESTONE_RATES.items()))
        parts.append(f"{_fmt(flat.get(TOKENS_PER_S), '.0f')} tok/s")
        parts.append(f"env queue {_fmt(flat.get(ENV_QUEUE), '.0f')}")
        parts.append(f"staleness {_fmt(flat.get(STALENESS), '.2f')}")
        return " | ".join(parts)

    def _render(self, step: int, flat: Mapping[str, Any]) -> Any:
        from rich.panel import Panel
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        bar = ProgressBar(total=max(self.total_steps, 1), completed=min(step, self.total_steps), width=40)
        table.add_row("progress", bar)
        table.add_row("reward", _fmt(flat.get(REWARD)))
        for label, key in MILESTONE_RATES.items():
            table.add_row(label, _pct(flat.get(key)))
        table.add_row("tokens/s", _fmt(flat.get(TOKENS_PER_S), ".0f"))
        table.add_row("env queue", _fmt(flat.get(ENV_QUEUE), ".0f"))
        table.add_row("buffer depth", _fmt(flat.get(BUFFER_DEPTH), ".0f"))
        table.add_row("staleness", _fmt(flat.get(STALENESS), ".2f"))
        elapsed = time.monotonic() - self._started
        title = f"{self.stage or 'training'}: step {step}/{self.total_steps}, {elapsed / 60:.1f} min"
        return Panel(table, title=title, expand=False)


def _fmt(value: Any, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"
