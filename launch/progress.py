"""The training run's live progress on the terminal, from the metric names of launch/metrics.py."""
from __future__ import annotations

import logging
import time
from typing import Any, Mapping

from launch.metrics import BUFFER_DEPTH, ENV_QUEUE, MILESTONE_RATES, REWARD, STALENESS, TOKENS_PER_S, flatten


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
