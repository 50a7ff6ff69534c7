"""`cuda-agent episode`: one agent episode on one task, on this machine, with a local env pool."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from env_pool.pool import EnvPool
from rollout.env_client import LocalEnvClient
from rollout.episode import EpisodeSettings
from rollout.episode_runner import EpisodeRunner, jobs_for
from rollout.policy import make_policy
from rollout.trajectory import Trajectory


def episode_runner(cfg: Any, policy: Any, env: Any, max_turns: int | None = None,
                   episodes_in_flight: int | None = None, keep_solution: bool = False) -> EpisodeRunner:
    """An EpisodeRunner wired from the config's rollout and env sections."""
    settings = EpisodeSettings.from_config(cfg.rollout, cfg.env.reward.failure, max_turns)
    return EpisodeRunner(
        policy, env, settings,
        backend=str(getattr(cfg.env.backend, "value", cfg.env.backend)),
        workspace_root=Path(os.path.expanduser(cfg.env.work_dir)) / "workspaces",
        observation_max_chars=cfg.rollout.observation_max_chars,
        episodes_in_flight=episodes_in_flight or cfg.rollout.episodes_in_flight,
        generate_rate=cfg.rollout.generation_rps,
        skill_in_prompt=cfg.rollout.skill_in_prompt,
        keep_solution=keep_solution,
    )


async def run_single_episode(cfg: Any, task: Any, policy_spec: str, out: str | None,
                             progress: bool = True) -> tuple[Trajectory, Path]:
    pool = EnvPool(OmegaConf.to_container(cfg.env, enum_to_str=True))
    policy = make_policy(policy_spec, cfg)
    try:
        runner = episode_runner(cfg, policy, LocalEnvClient(pool))
        traj = None
        async for traj in runner.run_many(jobs_for([task]), progress=progress):
            pass
    finally:
        await policy.close()
    path = Path(out) if out else Path(cfg.logging.out_dir) / "episodes" / f"{traj.episode_id}.msgpack"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(traj.pack())
    return traj, path
