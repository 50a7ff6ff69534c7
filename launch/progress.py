"""The training run's live progress on the terminal, from the metric names of launch/metrics.py.

A run spends minutes between its steps: starting the engines, building a stage's learner,
generating a step's episodes, training on them. Each is a *phase* the display names while it
lasts, with its elapsed time and, where the driver can ask (launch/train.py), what is under way
in it (episodes done and in flight, their turns), so that a terminal is never silent for long.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, Mapping

from launch.metrics import flatten
from protocol.step_record import BUFFER_DEPTH, ENV_QUEUE, REWARD, SKIPPED, STALENESS, TOKENS_PER_S, milestone_rates

Detail = Callable[[], Awaitable[str]]


class ProgressDisplay:
    """The training run on the terminal: a live panel on a TTY, log lines otherwise.

    Shows the step, the reward and milestone rates, tokens/s, the env queue depth and the
    buffer's staleness, read from the same metric names the sink writes; between steps, the
    phase under way. Off a terminal, a phase is a line when it begins and, while it lasts, a line
    every ``heartbeat_s`` with its detail; a step is one line.
    """

    def __init__(self, total_steps: int, stage: str = "", enabled: bool = True, console: Any = None,
                 heartbeat_s: float = 60.0, refresh_s: float = 2.0, env_kind: str = "kernel"):
        from rich.console import Console

        self.total_steps = total_steps
        self.stage = stage
        self.milestones = milestone_rates(env_kind)
        self.console = console or Console(stderr=True)
        # Not a terminal (CI, a log file, a Ray job): live redraws would fill the log with frames.
        self.live_mode = enabled and self.console.is_terminal
        self.heartbeat_s, self.refresh_s = heartbeat_s, refresh_s
        self._live = None
        self._started = time.monotonic()
        self._step, self._flat = 0, {}
        self._phase: tuple[str, float] | None = None  # (what, since)
        self._detail = ""
        self.logger = logging.getLogger("cuda_agent.progress")

    def __enter__(self) -> "ProgressDisplay":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        if self.live_mode and self._live is None:
            from rich.live import Live

            # get_renderable: redrawn at every refresh, so a phase's clock moves while the driver blocks.
            self._live = Live(get_renderable=self._render_now, console=self.console, refresh_per_second=2,
                              transient=not self.stage)  # the start-up's status goes; each stage's last panel stays
            self._live.start()

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def at_step(self, step: int) -> None:
        """The stage resumes at ``step`` (its checkpoint's)."""
        self._step = step

    def begin_stage(self, stage: str, total_steps: int, step: int = 0) -> None:
        """A new stage's panel (a terminal keeps the last frame of the one before)."""
        self.stop()
        self.stage, self.total_steps, self._step, self._flat = stage, total_steps, step, {}
        self._started = time.monotonic()
        self.start()

    @contextlib.contextmanager
    def phase(self, what: str) -> Iterator[None]:
        """``what`` the run is doing until the block ends (a blocking call: no detail to ask for)."""
        self._phase, self._detail = (what, time.monotonic()), ""
        if not self.live_mode:
            self.logger.info(self._prefix() + what)
        try:
            yield
        finally:
            self._phase, self._detail = None, ""

    @contextlib.asynccontextmanager
    async def watched_phase(self, what: str, detail: Detail | None = None) -> AsyncIterator[None]:
        """A phase awaited in the block: its detail ``detail()`` asked every refresh_s (None: its
        clock alone), and off a terminal a line every heartbeat_s while it lasts."""
        with self.phase(what):
            watcher = asyncio.create_task(self._watch(what, detail))
            try:
                yield
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher

    async def _watch(self, what: str, detail: Detail) -> None:
        logged = time.monotonic()
        while True:
            try:
                self._detail = await detail() if detail is not None else ""
            except Exception as err:  # noqa: BLE001 - a progress line never fails the run
                self._detail = f"(no detail: {type(err).__name__})"
            if not self.live_mode and time.monotonic() - logged >= self.heartbeat_s and self._phase:
                logged = time.monotonic()
                said = f": {self._detail}" if self._detail else ""
                self.logger.info(f"{self._prefix()}{what}{said} ({_clock(logged - self._phase[1])})")
            await asyncio.sleep(self.refresh_s)

    def update(self, step: int, metrics: Mapping[str, Any], stage: str | None = None) -> None:
        self.stage = stage or self.stage
        self._step, self._flat = step, flatten(metrics)
        if self._live is not None:
            self._live.refresh()
        else:
            self.logger.info(self.line(step, self._flat))

    def line(self, step: int, flat: Mapping[str, Any]) -> str:
        """The plain one-line form of a step."""
        parts = [f"step {step}/{self.total_steps}" + (f" [{self.stage}]" if self.stage else "")]
        if flat.get(SKIPPED):  # nothing trained: no throughput to speak of
            parts.append(f"skipped: {flat[SKIPPED]}")
        parts.append(f"reward {_fmt(flat.get(REWARD))}")
        parts.append(" ".join(f"{label.split()[-1]} {_pct(flat.get(key))}" for label, key in self.milestones.items()))
        if not flat.get(SKIPPED):
            parts.append(f"{_fmt(flat.get(TOKENS_PER_S), '.0f')} tok/s")
        parts.append(f"env queue {_fmt(flat.get(ENV_QUEUE), '.0f')}")
        parts.append(f"staleness {_fmt(flat.get(STALENESS), '.2f')}")
        return " | ".join(parts)

    def _prefix(self) -> str:
        if not self.stage:
            return ""
        return f"step {min(self._step + 1, self.total_steps)}/{self.total_steps} [{self.stage}]: "  # as a step's line begins

    def _now(self) -> str:
        if self._phase is None:
            return ""
        what, since = self._phase
        return f"{what} ({_clock(time.monotonic() - since)})"

    def _render_now(self) -> Any:
        return self._render(self._step, self._flat)

    def _render(self, step: int, flat: Mapping[str, Any]) -> Any:
        from rich.panel import Panel
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        elapsed = time.monotonic() - self._started
        if not self.stage:  # the start-up: only what is under way
            table.add_row("now", self._now() or "starting")
            return Panel(table, title=f"starting, {elapsed / 60:.1f} min", expand=False)
        bar = ProgressBar(total=max(self.total_steps, 1), completed=min(step, self.total_steps), width=40)
        table.add_row("progress", bar)
        if flat.get(SKIPPED):
            table.add_row("last step", f"skipped: {flat[SKIPPED]}")
        table.add_row("reward", _fmt(flat.get(REWARD)))
        for label, key in self.milestones.items():
            table.add_row(label, _pct(flat.get(key)))
        table.add_row("tokens/s", "-" if flat.get(SKIPPED) else _fmt(flat.get(TOKENS_PER_S), ".0f"))
        table.add_row("env queue", _fmt(flat.get(ENV_QUEUE), ".0f"))
        table.add_row("buffer depth", _fmt(flat.get(BUFFER_DEPTH), ".0f"))
        table.add_row("staleness", _fmt(flat.get(STALENESS), ".2f"))
        if self._phase is not None:
            table.add_row("now", self._now())
            if self._detail:
                table.add_row("", self._detail)
        title = f"{self.stage}: step {step}/{self.total_steps}, {elapsed / 60:.1f} min"
        return Panel(table, title=title, expand=False)


def _clock(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def _fmt(value: Any, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"
