"""Held-out evaluation during training: every ``eval.every_steps`` learner steps, a small sweep
over ``eval.heldout_tasks`` on the running generators, logged to heldout.jsonl and TensorBoard.

Why it runs beside generation and not instead of it: the sweep's episodes go to the same
generators as training's, as extra concurrent requests (to_buffer=False, so none reaches the
learner), and the driver does not wait for them; training episodes keep flowing. One sweep at
a time: a due sweep is skipped (and says so) while the previous one still runs. The episodes
use the stage's turn budget and whatever weights the generators serve while they run (their
versions are logged); the end of a stage waits for a sweep in flight, so none is lost.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

from ray.exceptions import RayActorError

from configs.load import ConfigError
from protocol.results import Milestone
from tasks.loader import load_tasks
from tasks.task import Task

log = logging.getLogger("cuda_agent.heldout")

HELDOUT_FILE = "heldout.jsonl"


class HeldOutEval:
    def __init__(self, tasks: list[Task], every_steps: int, samples: int, out: Path):
        self.tasks, self.every_steps, self.samples, self.out = tasks, every_steps, samples, out
        self.running: asyncio.Task | None = None
        self.skipped = 0

    @classmethod
    def from_config(cls, cfg: Any, out: Path) -> "HeldOutEval | None":
        every = int(cfg.eval.every_steps)
        if every <= 0:
            return None
        if not cfg.eval.heldout_tasks:
            raise ConfigError("eval.every_steps > 0 runs a held-out sweep during training: set eval.heldout_tasks to "
                              "problem files or folders kept out of stage.tasks")
        tasks, failures = load_tasks(list(cfg.eval.heldout_tasks))
        if failures or not tasks:
            what = failures[0].path + ": " + failures[0].reason if failures else "no problems"
            raise ConfigError(f"eval.heldout_tasks: {what}")
        return cls(tasks, every, int(cfg.eval.heldout_samples), out)

    def warn_overlap(self, training: list[Task]) -> None:
        """A held-out problem that is also a training problem (same source) measures recall, not generalisation."""
        sources = {t.source.strip() for t in training}
        shared = [t.id for t in self.tasks if t.source.strip() in sources]
        if shared:
            log.warning("eval.heldout_tasks shares %d problem(s) with stage.tasks (%s): those are not held out",
                        len(shared), ", ".join(shared[:5]))

    def maybe_start(self, step: int, generators: list[Any], sink: Any) -> bool:
        """Start the sweep due at global ``step`` (1-based) in the background; False if none started."""
        if step % self.every_steps:
            return False
        if self.running is not None and not self.running.done():
            self.skipped += 1
            log.warning("held-out sweep due at step %d skipped: the previous one is still running", step)
            return False
        self.running = asyncio.create_task(self._sweep(step, generators, sink))
        return True

    async def wait(self) -> None:
        """Let a sweep in flight finish (the end of a stage); a cancelled one is let go."""
        if self.running is not None and not self.running.cancelled():
            await asyncio.gather(self.running, return_exceptions=True)

    def cancel(self) -> None:
        """Ctrl-C: the sweep in flight is dropped, not waited for."""
        if self.running is not None:
            self.running.cancel()

    async def _sweep(self, step: int, generators: list[Any], sink: Any) -> dict[str, Any]:
        started = time.monotonic()
        jobs = [(t.to_dict(), f"heldout-{step}-{t.id.replace('/', '-')}-s{k}") for t in self.tasks for k in range(self.samples)]

        async def one(i: int, job: tuple[dict[str, Any], str]) -> Any:
            try:
                [traj] = await generators[i % len(generators)].run.remote([job], False)
                return traj
            except RayActorError:  # a dead generator: training reruns its own episodes; a held-out one is only missed
                return None

        try:
            trajs = [t for t in await asyncio.gather(*(one(i, j) for i, j in enumerate(jobs))) if t is not None]
        except Exception as err:  # a held-out sweep must never stop training: it is a measurement
            log.warning("held-out sweep of step %d failed: %s: %s", step, type(err).__name__, err)
            trajs = []
        record = summarize(trajs, step, time.monotonic() - started, len(jobs))
        with open(self.out / HELDOUT_FILE, "a") as f:
            f.write(json.dumps(record) + "\n")
        sink.log_side(step, {k: v for k, v in record.items() if k.startswith("heldout/")})
        return record


def summarize(trajs: list[Any], step: int, wall_s: float, jobs: int) -> dict[str, Any]:
    n = max(len(trajs), 1)
    rate = lambda m: sum(t.milestone >= m for t in trajs) / n  # noqa: E731
    return {
        "step": step, "time": time.time(),
        "heldout/episodes": len(trajs), "heldout/missed": jobs - len(trajs),
        "heldout/pass": rate(Milestone.CORRECT),
        "heldout/faster_than_eager": rate(Milestone.FASTER_THAN_EAGER),
        "heldout/faster_than_compile": rate(Milestone.FASTER_THAN_COMPILE),
        "heldout/reward_mean": sum(t.reward for t in trajs) / n,
        "heldout/turns_mean": sum(len(t.turns) for t in trajs) / n,
        "heldout/generated_tokens_mean": sum(t.num_generated for t in trajs) / n,
        "heldout/wall_s": wall_s,
        "versions": sorted({v for t in trajs for v in t.versions}),
        "episodes": [{"episode_id": t.episode_id, "task_id": t.task_id, "milestone": t.milestone, "reward": t.reward,
                      "stop_reason": t.stop_reason, "turns": len(t.turns)} for t in trajs],
    }
