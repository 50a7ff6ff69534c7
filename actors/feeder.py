"""JobFeeder: keeps every generator busy with episodes, and reruns what a dead generator held.

Each generator has at most one chunk of jobs outstanding (``episodes_in_flight`` episodes);
when a chunk comes back the generator gets the next. Tasks are drawn in shuffled passes over
the task set. A job keeps its episode id for life: if its generator dies, the chunk goes back
to the front of the queue under the same ids, and the buffer's exactly-once rule makes sure an
episode that had already been accepted is not counted twice.
"""
from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from typing import Any, Awaitable, Callable

import ray
from ray.exceptions import RayActorError

from actors.system import retry_while_restarting
from tasks.task import Task

log = logging.getLogger("cuda_agent.jobs")


class TaskSampler:
    """Shuffled passes over the task set; episode ids are unique and stable across reruns.

    With ``group_size`` > 1 each task drawn is handed out that many times in a row, one group;
    ``group_of`` names an episode's group (reruns keep their ids, so they keep their group)."""

    def __init__(self, tasks: list[Task], seed: int, prefix: str = "ep", group_size: int = 1):
        if not tasks:
            raise ValueError("the training task set is empty: set stage.tasks to problem files or folders")
        if group_size < 1:
            raise ValueError(f"stage.group_size must be at least 1, got {group_size}")
        self.tasks, self.rng, self.prefix, self.group_size = tasks, random.Random(seed), prefix, group_size
        self.by_id = {t.id: t for t in tasks}
        self.order: deque[Task] = deque()
        self.count = 0
        self.groups: dict[str, str] = {}  # episode id -> group key
        self._current: tuple[Task, str] | None = None
        self._left = 0

    def next(self) -> tuple[dict[str, Any], str]:
        if self._left == 0:
            if not self.order:
                self.order.extend(self.rng.sample(self.tasks, len(self.tasks)))
            task = self.order.popleft()
            self._current, self._left = (task, f"{self.prefix}-g{self.count + 1:07d}"), self.group_size
        task, group = self._current
        self._left -= 1
        self.count += 1
        episode_id = f"{self.prefix}-{self.count:07d}-{task.id.replace('/', '-')}"
        self.groups[episode_id] = group
        return task.to_dict(), episode_id

    def group_of(self, episode_id: str) -> str:
        """The group key of an episode this sampler handed out (its own id for any other)."""
        return self.groups.get(episode_id, episode_id)

    def task_dict(self, task_id: str) -> dict[str, Any]:
        return self.by_id[task_id].to_dict()


class JobFeeder:
    def __init__(self, generators: list[Any], sampler: TaskSampler, chunk: int,
                 on_restart: Callable[[Any], Awaitable[None]], to_buffer: bool = True):
        self.generators, self.sampler, self.chunk = generators, sampler, chunk
        self.on_restart = on_restart  # re-prepares a restarted generator (engine, weights)
        self.to_buffer = to_buffer
        self.requeued: deque[tuple[dict[str, Any], str]] = deque()
        self.reruns = 0
        self.restarts = 0
        self.submitted = 0
        self.inflight: set[Any] = set()  # ObjectRefs of chunks running now

    def take(self, n: int) -> list[tuple[dict[str, Any], str]]:
        jobs = []
        while len(jobs) < n:
            jobs.append(self.requeued.popleft() if self.requeued else self.sampler.next())
        self.submitted += n
        return jobs

    def requeue(self, jobs: list[tuple[dict[str, Any], str]]) -> None:
        self.requeued.extendleft(reversed(jobs))
        self.reruns += len(jobs)

    async def run_forever(self) -> None:
        """Until cancelled: each generator runs chunk after chunk."""
        await asyncio.gather(*(self._serve(g) for g in self.generators))

    async def run_count(self, episodes: int) -> list[Any]:
        """Exactly ``episodes`` episodes spread over the generators (the synchronous mode); their results."""
        shares = [episodes // len(self.generators) + (i < episodes % len(self.generators)) for i in range(len(self.generators))]
        results = await asyncio.gather(*(self._run_chunk(g, self.take(n)) for g, n in zip(self.generators, shares) if n))
        return [r for chunk in results for r in chunk]

    async def _serve(self, generator: Any) -> None:
        while True:
            await self._run_chunk(generator, self.take(self.chunk))

    async def _run_chunk(self, generator: Any, jobs: list[tuple[dict[str, Any], str]]) -> list[Any]:
        while True:
            ref = generator.run.remote(jobs, self.to_buffer)
            self.inflight.add(ref)
            try:
                return await ref
            except RayActorError as err:
                self.restarts += 1
                log.warning("generator died (%s); rerunning its %d episode(s) after it restarts", type(err).__name__, len(jobs))
                self.reruns += len(jobs)
                await retry_while_restarting(lambda: self.on_restart(generator), (RayActorError,))
            finally:
                self.inflight.discard(ref)

    async def cancel(self, buffer: Any) -> int:
        """Stop the running chunks and empty the buffer of what they made; returns the episodes dropped."""
        for ref in list(self.inflight):
            ray.cancel(ref)
        self.inflight.clear()
        depth = (await buffer.stats.remote())["depth"]
        if depth:
            await buffer.get_batch.remote(max_episodes=depth, timeout_s=1.0)
        return depth
