"""`cuda-agent episode`: one agent episode on one task, on this machine, with a local env pool."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from env_pool.pool import EnvPool
from launch.embedded_model import resolve_policy
from protocol.trajectory import Trajectory
from rollout.env_client import LocalEnvClient
from rollout.episode_runner import EpisodeRunner, jobs_for
from rollout.policy import make_policy


async def run_single_episode(cfg: Any, task: Any, policy_spec: str, out: str | None,
                             progress: bool = True, console: Any = None) -> tuple[Trajectory, Path]:
    pool = EnvPool(cfg.env)
    policy = make_policy(*resolve_policy(policy_spec, cfg))
    try:
        runner = EpisodeRunner.from_config(cfg, policy, LocalEnvClient(pool))
        traj = None
        async for traj in runner.run_many(jobs_for([task]), progress=progress, console=console):
            pass
    finally:
        await policy.close()
    path = Path(out) if out else Path(cfg.logging.out_dir) / "episodes" / f"{traj.episode_id}.msgpack"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(traj.pack())
    return traj, path
