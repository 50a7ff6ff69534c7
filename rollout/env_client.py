"""How the agent's tools reach the kernel environment: one small async interface, two transports.

``LocalEnvClient`` calls an ``EnvPool`` in this process (tests, single-machine evaluation);
``RayEnvClient`` spreads requests over ``EnvWorker`` actors, least pending first, and turns
their msgpack-ready dicts back into ``EvalResult``. The tools only see ``EnvClient``, so they
never import Ray (rollout/ does not depend on actors/).
"""
from __future__ import annotations

import zlib
from typing import Any, Mapping, Protocol, runtime_checkable

from protocol.results import EvalResult
from tasks.task import Task


@runtime_checkable
class EnvClient(Protocol):
    async def evaluate(self, task: Task, files: Mapping[str, str], mode: str) -> EvalResult:
        """Compile ("compile"), verify ("verify") or verify and time ("full") a candidate."""
        ...

    async def profile_reference(self, task: Task) -> dict[str, Any]:
        """The reference's eager time and top operators (env_pool/reference_profile.py)."""
        ...

    async def ncu(self, task: Task, files: Mapping[str, str]) -> str:
        """An Nsight Compute summary of the candidate's kernels, or a line saying why there is none."""
        ...


class LocalEnvClient:
    """An EnvPool in this process."""

    def __init__(self, pool: Any):  # env_pool.pool.EnvPool
        self.pool = pool

    async def evaluate(self, task: Task, files: Mapping[str, str], mode: str) -> EvalResult:
        return await self.pool.evaluate(task, dict(files), mode)

    async def profile_reference(self, task: Task) -> dict[str, Any]:
        return await self.pool.profile_reference(task)

    async def ncu(self, task: Task, files: Mapping[str, str]) -> str:
        return await self.pool.ncu(task, dict(files))


class RayEnvClient:
    """EnvWorker actors, each request to the worker with the fewest of this client's requests pending.

    Pending counts are this client's own (no round trip to ask a worker how busy it is); with one
    client per generator and several generators, the workers' bounded queues do the rest.
    """

    def __init__(self, workers: list[Any]):
        if not workers:
            raise ValueError("RayEnvClient needs at least one EnvWorker handle")
        self.workers = list(workers)
        self.pending = [0] * len(self.workers)

    async def evaluate(self, task: Task, files: Mapping[str, str], mode: str) -> EvalResult:
        return await self._call("evaluate", task, dict(files), mode)

    async def profile_reference(self, task: Task) -> dict[str, Any]:
        # Each worker caches its own profiles: asking the same worker for a task keeps them warm.
        return await self._call("profile_reference", task, worker=zlib.crc32(task.id.encode()) % len(self.workers))

    async def ncu(self, task: Task, files: Mapping[str, str]) -> str:
        return await self._call("ncu", task, dict(files))

    async def _call(self, method: str, *args: Any, worker: int | None = None) -> Any:
        i = worker if worker is not None else min(range(len(self.workers)), key=self.pending.__getitem__)
        self.pending[i] += 1
        try:
            # An ObjectRef is awaitable: the event loop stays free while the worker runs.
            return await getattr(self.workers[i], method).remote(*args)
        finally:
            self.pending[i] -= 1

