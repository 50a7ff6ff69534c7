"""TrajectoryBuffer: the Ray actor that holds the run's TrajectoryQueue (actors/trajectory_queue.py).

Generators push each finished trajectory (actors/buffer_client.py, ``push``): the trajectory
goes into the object store with ``ray.put`` and only its reference travels, with its
TrajectoryMeta alongside, so the buffer judges and batches without ever fetching a trajectory.
The driver asks for batches and decides on their metas; only the learner's ranks fetch the
trajectories themselves (``fetch``, in LearnerGroup.step).
"""
from __future__ import annotations

from typing import Any, Mapping

import ray

from actors.trajectory_queue import Batch, TrajectoryQueue


@ray.remote(num_cpus=0)
class TrajectoryBuffer:
    """Ray actor around TrajectoryQueue (async: a put on a full buffer waits without blocking gets).

    Takes no CPU: it only moves references and counters, and must not need a slot of the plan.
    """

    def __init__(self, capacity: int = 64, max_staleness: int = 1, stale_policy: str = "drop",
                 stale_weight: float = 0.5, version: int = 0, max_turn_staleness: int = 4):
        self.queue = TrajectoryQueue(capacity, max_staleness, stale_policy, stale_weight, version, max_turn_staleness)

    async def put(self, meta: Mapping[str, Any], refs: list[Any]) -> str:
        # The reference comes wrapped in a list: Ray resolves top-level ObjectRef arguments, and the
        # buffer must hold the reference, not the trajectory.
        (ref,) = refs
        return await self.queue.put(meta, ref)

    async def set_version(self, version: int) -> None:
        await self.queue.set_version(version)

    async def get_batch(self, max_episodes: int | None = None, max_tokens: int | None = None,
                        timeout_s: float | None = None) -> Batch:
        return await self.queue.get_batch(max_episodes, max_tokens, timeout_s)

    async def forget(self, episode_ids: list[str]) -> int:
        return await self.queue.forget(episode_ids)

    async def stats(self) -> dict[str, Any]:
        return self.queue.stats().to_dict()

    async def close(self) -> None:
        await self.queue.close()
