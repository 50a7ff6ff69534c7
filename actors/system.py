"""The running system: env workers, the buffer, generators and the learner, placed per the plan.

Restart policy, and why: env workers and generators restart on their own (Ray's
``max_restarts``) because they hold nothing that cannot be rebuilt: an env worker's state is
caches, a generator's is an engine the driver re-syncs with the current weights. The learner
group is restarted whole by the driver (a dead rank breaks the others' process group), which
then resumes it from its last checkpoint.

The policy version has one owner, this System: ``version`` is the version of the weights the
learner holds now. The driver advances it when a learner step changed the policy (a critic-only
warm-up step does not), and every other part reads it from here: the learner judges a token
stale when it is older, the buffer judges trajectories against it, and a weight push labels the
generators' new weights with it. ``served`` is what the generators serve, behind ``version``
between pushes; a push happens only when they are behind, so a step that left the policy as it
was bumps nothing and strands no in-flight episode as stale.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

import ray
from ray.exceptions import RayActorError

from actors.buffer import TrajectoryBuffer
from actors.generator import GeneratorActor
from actors.learner_group import LearnerGroup, StepResult
from actors.run_logs import actor_creation_output
from actors.storage import RunStorage
from actors.topology import Reservation, ResourcePlan
from actors.trajectory_queue import buffer_options
from actors.weight_sync import push_weights, resolve_transport
from configs.schema import EnvConfig
from env_pool.answer_check import AnswerWorker
from env_pool.pool import EnvWorker


class LearnerDied(RuntimeError):
    """The learner actor died mid-call; Ray restarts it and the driver resumes it from its checkpoint."""


async def retry_while_restarting(call: Callable[[], Awaitable[Any]], errors: tuple[type[BaseException], ...],
                                 timeout_s: float = 900.0) -> Any:
    """Ray restarts a dead actor; until it is back, calls to it fail as unavailable. Keep trying."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await call()
        except errors:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1.0)


@dataclass
class System:
    env_workers: list[Any]
    buffer: Any
    generators: list[Any]
    learner: LearnerGroup
    transport: str = "object_store"  # weight sync (actors/weight_sync.py)
    bucket_mb: int = 512
    sync_timeout_s: float = 600.0
    version: int = 0  # the policy version of the learner's weights: owned here (see the module doc)
    served: int = 0  # the policy version the generators serve (at most ``version``)

    async def learn(self, method: str, *args: Any) -> Any:
        """Call every learner rank; a rank's death becomes LearnerDied, which the driver recovers from."""
        return await self._learner_call(lambda: self.learner.call(method, *args), method)

    async def train_step(self, refs: list[Any], sizes: list[int], weights: list[float],
                         episode_advantages: list[float] | None = None) -> StepResult:
        """One learner step, the batch dealt over the ranks, judged against the current version: its
        metrics and the positions of trajectories lost before a rank fetched them (LearnerGroup.step)."""
        return await self._learner_call(
            lambda: self.learner.step(refs, sizes, weights, self.version, episode_advantages), "step")

    async def set_version(self, version: int) -> None:
        """The learner's weights are ``version`` now; the buffer judges staleness against it."""
        if version < self.version:
            raise ValueError(f"the policy version must not go backwards: {self.version} -> {version}")
        self.version = version
        await self.buffer.set_version.remote(version)

    async def policy_updated(self) -> int:
        """A learner step changed the policy: its weights are the next version."""
        await self.set_version(self.version + 1)
        return self.version

    async def _learner_call(self, call: Callable[[], Awaitable[Any]], what: str) -> Any:
        try:
            return await call()
        except RayActorError as err:
            raise LearnerDied(f"a learner rank died during {what}: {err}") from err

    async def restart_learner(self) -> None:
        await self.learner.restart()

    async def restart_after_hung_sync(self, generator: Any) -> None:
        """A NCCL swap failed or ran past its deadline: a side may be blocked in NCCL for good,
        so both are replaced (Ray restarts the generator; the driver resumes the learner)."""
        ray.kill(generator, no_restart=False)
        raise LearnerDied(f"a weight broadcast did not finish within cluster.weight_sync_timeout_s="
                          f"{self.sync_timeout_s}; the learner and the generator are restarted")

    async def sync_weights(self, generators: list[Any] | None = None) -> float:
        """Push the learner's policy, labelled ``version``, to ``generators`` (None: all of them);
        returns the slowest swap's seconds."""
        targets = [(i, g) for i, g in enumerate(self.generators) if generators is None or g in generators]
        results = await push_weights(self, targets, self.version, self.transport, self.bucket_mb, self.sync_timeout_s)
        for result in results:  # a generator that died mid-swap is re-synced by the driver when it restarts
            if isinstance(result, BaseException) and not isinstance(result, RayActorError):
                raise result
        if generators is None:
            self.served = self.version
        return max((r for r in results if isinstance(r, float)), default=0.0)

    async def load_policy(self, path: str, version: int) -> float:
        """Point every generator at a stage's exported policy folder, whose weights are ``version``
        (when no learner holds them yet)."""
        seconds = await asyncio.gather(*(g.load_folder.remote(path, version) for g in self.generators))
        self.served = version
        return max(seconds, default=0.0)

    def shutdown(self) -> None:
        self.learner.kill()
        for actor in [*self.generators, self.buffer, *self.env_workers]:
            ray.kill(actor, no_restart=True)


def start_env_workers(reservation: Reservation, env_cfg: EnvConfig) -> list[Any]:
    """An env worker in each of the plan's env worker slots, each told its share of its node's CPUs: an
    EnvWorker (kernels), or with env.kind=verifier an AnswerWorker (the learning check)."""
    slots = reservation.plan.env_workers
    shares = reservation.node_shares(slots)
    worker = AnswerWorker if env_cfg.kind == "verifier" else EnvWorker  # the learning check, or kernels
    return [worker.options(max_restarts=-1, max_task_retries=1, **reservation.options(slot))
            .remote(env_cfg, cpu_share=shares[slot.index]) for slot in slots]


def start_generators(cfg: Any, reservation: Reservation, env_workers: list[Any], buffer: Any, policy_spec: str,
                     name: str, log_dir: str | Path, episodes_in_flight: int | None = None, keep_solution: bool = False,
                     storage: RunStorage | None = None) -> list[Any]:
    """A generator in each of the plan's generator slots, named NAME-INDEX, restarted by Ray if it dies:
    training's (buffer given) and an evaluation sweep's (no buffer; each episode's final files kept)."""
    with actor_creation_output(cfg.logging, log_dir):
        return [GeneratorActor.options(name=f"{name}-{slot.index}", max_restarts=-1, max_task_retries=0,
                                       **reservation.options(slot))
                .remote(cfg, env_workers, buffer, slot.index, policy_spec, episodes_in_flight, keep_solution, storage)
                for slot in reservation.plan.generators]


async def start_system(cfg: Any, plan: ResourcePlan, reservation: Reservation, model: str,
                       storage: RunStorage | None = None) -> System:
    """Create every actor in its reserved bundle and start the engines (in parallel: they are slow).
    ``model``: the policy's model folder (cfg.model.path as the launcher resolved it), which the
    generators serve. ``storage``: how actors on other nodes than the driver's reach the run
    folder and the model."""
    transport = resolve_transport(cfg.cluster)
    # Each actor gets the typed config (or its section): it travels as the OmegaConf object it is.
    env_workers = start_env_workers(reservation, cfg.env)
    buffer = TrajectoryBuffer.remote(**buffer_options(cfg.stage))
    # Named, so that an operator (or a test) can find them: ray.get_actor("cuda-agent-generator-0").
    generators = start_generators(cfg, reservation, env_workers, buffer, f"vllm:{model}", "cuda-agent-generator",
                                  cfg.logging.out_dir, storage=storage)
    learner = LearnerGroup(cfg, [reservation.options(slot) for slot in plan.learner], storage)
    await asyncio.gather(learner.start(), *(g.start.remote() for g in generators))
    return System(env_workers, buffer, generators, learner, transport, cfg.rollout.weight_bucket_mb,
                  cfg.cluster.weight_sync_timeout_s)
