"""GeneratorActor: one vLLM engine running many agent episodes, streaming trajectories to the buffer.

The driver hands it jobs (task, episode id); episodes call the env workers through a
RayEnvClient; each finished trajectory goes into the object store (``push``) and only its
reference travels to the TrajectoryBuffer. Weights arrive by one of the transports of
actors/weight_sync.py (object-store buckets, a NCCL broadcast, CUDA IPC handles) and are
hot-swapped into the running engine: episodes in flight carry on, and each turn records the
policy version that generated it.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, Mapping

import ray
from omegaconf import OmegaConf

from actors.buffer_client import push
from actors.seeding import derived_seed, seed_process
from actors.storage import RunStorage
from configs.schema import Config
from rollout.env_client import RayEnvClient
from rollout.episode_runner import EpisodeRunner, Job
from rollout.policy import make_policy
from tasks.task import Task


@ray.remote
class GeneratorActor:
    def __init__(self, cfg: Mapping[str, Any], env_workers: list[Any], buffer: Any, index: int, policy_spec: str,
                 episodes_in_flight: int | None = None, keep_solution: bool = False,
                 storage: RunStorage | None = None):
        self.cfg = OmegaConf.merge(OmegaConf.structured(Config), cfg)
        seed_process(derived_seed(self.cfg.seed, "generator", index))
        self.index, self.buffer = index, buffer
        self.storage = storage or RunStorage()  # the run's files (exports) and inputs (the model), from any node
        # Training serves its model with vLLM; an evaluation sweep may name any policy spec
        # (rollout/policy.py), and keeps each episode's final solution files for its report. The
        # launcher resolved the spec's model folder ("embedded" prepared) before handing it here.
        self.policy_spec = policy_spec
        self.episodes_in_flight, self.keep_solution = episodes_in_flight, keep_solution
        self.env_workers = env_workers
        self.policy = None  # the engine starts on first use, inside the actor's event loop
        self.runner = None
        self.max_turns: int | None = None
        self.joined = False  # in a NCCL weight group with the learner (a restarted actor is not)
        self.starting = asyncio.Lock()  # a restarted actor may get a weight swap and a start at once
        self.stats = {"episodes": 0, "generated_tokens": 0, "busy_s": 0.0, "swaps": 0, "swap_s": 0.0}

    async def start(self, max_turns: int | None = None) -> dict[str, Any]:
        """Start the engine if it is not running (minutes on a GPU, ~30 s on CPU) and set the turn budget."""
        started = time.perf_counter()
        self.max_turns = max_turns
        await self._ready()
        return {"version": self.policy.version, "start_s": time.perf_counter() - started}

    async def set_max_turns(self, max_turns: int | None) -> None:
        """Stages differ in turn budget (single-turn warm-up vs agentic PPO); the engine stays."""
        self.max_turns = max_turns
        self.runner = None
        await self._ready()

    async def _ready(self) -> None:
        async with self.starting:
            if self.policy is None:
                self.policy = make_policy(await asyncio.to_thread(self._local_spec), self.cfg)
            if self.runner is None:
                self.runner = EpisodeRunner.from_config(self.cfg, self.policy, RayEnvClient(self.env_workers),
                                                        self.max_turns, self.episodes_in_flight, self.keep_solution)

    def _local_spec(self) -> str:
        """The policy spec with its model folder or replay file as this node reaches it."""
        kind, _, path = self.policy_spec.partition(":")
        if kind in ("vllm", "replay") and path.startswith("/"):
            return f"{kind}:{self.storage.fetch(path)}"
        return self.policy_spec

    async def run(self, jobs: list[tuple[dict[str, Any], str]], to_buffer: bool = True) -> list[Any]:
        """Run the jobs concurrently; returns what the buffer answered for each (or the trajectories)."""
        await self._ready()
        started = time.perf_counter()
        parsed = [Job(Task.from_dict(t), eid) for t, eid in jobs]
        results = await asyncio.gather(*(self._one(job, to_buffer) for job in parsed))
        self.stats["busy_s"] += time.perf_counter() - started
        return results

    async def _one(self, job: Job, to_buffer: bool) -> Any:
        traj = await self.runner.run_one(job)
        self.stats["episodes"] += 1
        self.stats["generated_tokens"] += traj.num_generated
        if not to_buffer:
            return traj
        return await push(self.buffer, traj, self.policy.version)  # waits while the buffer is full

    async def update_weights(self, bucket_refs: list[Any], version: int) -> float:
        """Swap in the learner's weights, fetched bucket by bucket from the object store."""
        async def tensors():
            for ref in bucket_refs:
                for name, tensor in await ref:
                    yield name, tensor

        named = [item async for item in tensors()]
        return await self._swap(lambda: self.policy.update_weights(named, version))

    async def update_weights_nccl(self, layouts: list[tuple[list, int]], version: int) -> float:
        """Receive the learner's NCCL broadcast of buckets with these layouts and swap them in."""
        return await self._swap(lambda: self.policy.update_weights_nccl(layouts, version))

    async def update_weights_ipc(self, handles: list[tuple[bytes, list]], device_uuid: str, version: int) -> float:
        """Copy in the buckets the learner shares on this GPU as CUDA IPC handles, and swap them in."""
        return await self._swap(lambda: self.policy.update_weights_ipc(handles, device_uuid, version))

    async def load_folder(self, path: str, version: int) -> float:
        """Swap in the weights of a Hugging Face folder (a stage's export), without a learner."""
        local = await asyncio.to_thread(self.storage.fetch, path)
        return await self._swap(lambda: self.policy.load_folder(str(local), version))

    async def _swap(self, swap: Callable[[], Awaitable[float]]) -> float:
        await self._ready()
        seconds = await swap()
        self.stats["swaps"] += 1
        self.stats["swap_s"] += seconds
        return seconds

    def num_workers(self) -> int:
        """vLLM worker processes (one per tensor-parallel GPU): each joins a NCCL weight group."""
        return max(1, self.cfg.cluster.generator_gpus)

    def weight_group_joined(self) -> bool:
        return self.joined

    async def join_weight_group(self, host: str, port: int, world_size: int) -> None:
        await self._ready()
        self.joined = False
        await self.policy.join_weight_group(host, port, world_size)
        self.joined = True

    async def check_weight_layouts(self, layouts: list[tuple[list, int]]) -> None:
        """Refuse wrong names or shapes before a broadcast starts (a refusal mid-broadcast blocks the learner)."""
        await self._ready()
        for layout, _ in layouts:
            self.policy.checked_layout(layout)

    def version(self) -> int:
        return self.policy.version

    def get_stats(self) -> dict[str, Any]:
        """Totals since the actor started, the policy version it serves (-1: no engine yet), and
        what its episodes are doing now (rollout/episode_runner.Activity; all 0 before it runs any)."""
        activity = self.runner.activity.snapshot() if self.runner else {}
        return dict(self.stats, version=self.policy.version if self.policy else -1,
                    activity={**dict.fromkeys(("started", "finished", "turns", "generating", "in_env"), 0), **activity})

    async def stop(self) -> None:
        if self.policy is not None:
            await self.policy.close()
