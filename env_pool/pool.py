"""EnvWorker: the Ray actor that evaluates candidates, one per GPU (cuda) or CPU slot (cpp).

Compiles run concurrently (``compile_workers`` at a time) while one candidate at a time holds
the timing lane, so candidates never time each other. ``max_pending`` bounds the work a
worker accepts: callers beyond it wait (backpressure) instead of piling up memory. A failure
of the environment itself ("infra") is retried (env.infra_retries times, with a growing pause);
a candidate's own failure never is.
On a GPU worker a timed-out or infra-failed run has the device examined (device_watch.py):
a hung device takes the worker out of service, and its evaluations fail as infra at once.
``ncu`` gives the agent an Nsight Compute summary of its kernels (ncu.py).
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Mapping

import ray
from omegaconf import OmegaConf

from configs.schema import EnvConfig
from env_pool.device_watch import DeviceWatch
from env_pool.evaluate import EvalContext, cpu_share, evaluate
from env_pool.isolation.sandbox_watchdog import move_threads
from env_pool.ncu import ncu_summary
from env_pool.reference_profile import ReferenceProfiles
from env_pool.reward import apply_reward
from protocol.results import EvalResult
from tasks.task import Task

log = logging.getLogger("cuda_agent.env")
INFRA_PAUSE_S = 1.0  # the first pause before an infra retry; each later one doubles


@dataclass
class WorkerStats:
    evaluated: int = 0
    pending: int = 0
    retried: int = 0
    infra_failures: int = 0
    busy_s: float = 0.0  # time with at least one evaluation in flight


def env_config(cfg: EnvConfig | Mapping[str, Any] | None) -> Any:
    """A typed EnvConfig from a dataclass, a DictConfig, a plain dict (as Ray ships it), or None."""
    base = OmegaConf.structured(EnvConfig)
    return base if cfg is None else OmegaConf.merge(base, cfg)


def device_health() -> dict[str, Any]:
    """Memory and utilisation of the visible GPUs through NVML; empty on a machine without one."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return {}
    try:
        report = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            report[i] = {"used_gib": mem.used / 2**30, "total_gib": mem.total / 2**30,
                         "util": pynvml.nvmlDeviceGetUtilizationRates(h).gpu}
        return report
    finally:
        pynvml.nvmlShutdown()


def take_cpu_share(rank: int, count: int) -> None:
    """Keep this process (every thread of it) to its share of the node's CPUs.

    Ray does not pin actors to CPUs, and split_cpus (env_pool/evaluate.py) gives the timed
    servers the first of the process's CPUs: without shares, every env worker of a node timed
    its candidates on the same CPU, each run's launches slowed by the others'."""
    if count > 1:
        cpus = set(cpu_share(sorted(os.sched_getaffinity(0)), rank, count))
        if not move_threads({os.getpid()}, cpus):
            log.warning("env worker %d of %d on this node: could not keep its threads to CPUs %s", rank, count, sorted(cpus))


class EnvPool:
    """The evaluation service of one worker; the Ray actor below wraps it, tests use it directly."""

    def __init__(self, cfg: EnvConfig | Mapping[str, Any] | None = None, max_pending: int = 64):
        self.ctx = EvalContext(cfg=env_config(cfg))
        self.slots = asyncio.Semaphore(max_pending)
        self.stats = WorkerStats()
        # After a timeout or infra failure on a GPU: is the device hung? (env_pool/device_watch.py)
        self.watch = DeviceWatch(self.ctx, enabled=str(self.ctx.cfg.backend) == "cuda")
        self.watch.attach()
        self.reference_profiles = ReferenceProfiles()  # per task: the reference does not change
        self._busy_since: float | None = None

    async def evaluate(self, task: Task | Mapping[str, Any], files: Mapping[str, str], mode: str = "full") -> EvalResult:
        task = task if isinstance(task, Task) else Task.from_dict(dict(task))
        async with self.slots:
            self._enter()
            try:
                if self.ctx.unhealthy:  # queued behind a hang: fail now, the caller retries elsewhere
                    self.stats.infra_failures += 1
                    return self._refused(task)
                result = await evaluate(self.ctx, task, files, mode)
                await self.watch.after(result)
                for attempt in range(int(self.ctx.cfg.infra_retries)):
                    if result.failure != "infra" or self.ctx.unhealthy:
                        break
                    # A disturbed machine (another process storming the CPUs) usually settles in seconds.
                    log.info("%s: the environment failed (%s); tried again in %.0f s", task.id,
                             result.message.splitlines()[0][:200] if result.message else "no message", INFRA_PAUSE_S * 2 ** attempt)
                    await asyncio.sleep(INFRA_PAUSE_S * 2 ** attempt)
                    self.stats.retried += 1
                    result = await evaluate(self.ctx, task, files, mode)
                    await self.watch.after(result)
                self.stats.infra_failures += result.failure == "infra"
                self.stats.evaluated += 1
                return result
            finally:
                self._leave()

    def close(self) -> None:
        """End the worker's harness and its servers now (they also end when this process does)."""
        self.ctx.close()

    def _refused(self, task: Task) -> EvalResult:
        result = EvalResult(task_id=task.id, backend=str(self.ctx.cfg.backend),
                            failure="infra", message=f"this worker's device is unhealthy ({self.ctx.unhealthy}); "
                                                     "retry the evaluation on another worker")
        return apply_reward(result, self.ctx.cfg.reward)

    async def ncu(self, task: Task | Mapping[str, Any], files: Mapping[str, str]) -> str:
        """Nsight Compute summary of the candidate's kernels over one forward call (env_pool/ncu.py)."""
        task = task if isinstance(task, Task) else Task.from_dict(dict(task))
        async with self.slots:
            if self.ctx.unhealthy:
                return f"unavailable: this worker's device is unhealthy ({self.ctx.unhealthy})"
            return await ncu_summary(self.ctx, task, files)

    def _enter(self) -> None:
        self.stats.pending += 1
        if self._busy_since is None:
            self._busy_since = time.monotonic()

    def _leave(self) -> None:
        self.stats.pending -= 1
        if self.stats.pending == 0 and self._busy_since is not None:
            self.stats.busy_s += time.monotonic() - self._busy_since
            self._busy_since = None

    async def profile_reference(self, task: Task | Mapping[str, Any]) -> dict[str, Any]:
        """The reference's eager time and top operators, for the agent (env_pool/reference_profile.py)."""
        task = task if isinstance(task, Task) else Task.from_dict(dict(task))
        async with self.slots:
            return await self.reference_profiles.get(self.ctx, task)

    def health(self) -> dict[str, Any]:
        state = self.watch.state
        return {"healthy": state.healthy, "unhealthy_reason": state.reason, "unhealthy_since": state.since,
                "device_checks": state.checks, "stats": self.stats.__dict__.copy(), "devices": device_health(),
                "cpus": sorted(os.sched_getaffinity(0))}


@ray.remote
class EnvWorker:
    """Ray actor around EnvPool: a Task in, an EvalResult back (protocol/results.py), as the objects they are."""

    def __init__(self, cfg: Mapping[str, Any] | None = None, max_pending: int = 64, cpu_share: tuple[int, int] = (0, 1)):
        # Before anything starts: the harness, servers and builds inherit this process's CPUs.
        take_cpu_share(*cpu_share)
        self.pool = EnvPool(cfg, max_pending)

    async def evaluate(self, task: Task, files: Mapping[str, str], mode: str = "full") -> EvalResult:
        return await self.pool.evaluate(task, files, mode)

    async def profile_reference(self, task: Task) -> dict[str, Any]:
        return await self.pool.profile_reference(task)

    async def ncu(self, task: Task, files: Mapping[str, str]) -> str:
        return await self.pool.ncu(task, files)

    async def health(self) -> dict[str, Any]:
        return self.pool.health()
