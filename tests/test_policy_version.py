"""One owner for the policy version (actors/system.py), driven through the driver's own stage
bookkeeping (launch/train.py: setup_learner, after_step) with a real PPO trainer and the real
buffer logic; only the Ray actors are stand-ins.

What it proves: after a stage transition, a new trainer judges tokens against the version the
generators were served (not its own count from 0), so an in-flight episode of the previous
version is stale to it; critic warm-up steps neither bump the version nor push weights, so an
episode of the current version stays fresh in the buffer; the first policy step then moves
the version, and the push labels the generators' weights with it.
"""
from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from actors.learner_group import StepResult
from actors.trajectory_queue import TrajectoryQueue
from protocol.trajectory_meta import TrajectoryMeta
from actors.system import System
from configs.schema import Config, LearnerConfig, LRSchedule
from launch.train import RecipeState, after_step, setup_learner

try:
    from tests.learner_toy import OBSERVATION, PROMPT, make_trajectory
    from tests.test_learner_training import learner_dist  # noqa: F401  (the module's gloo group)
except ImportError:  # tests/ is on sys.path itself under pytest's default import mode
    from learner_toy import OBSERVATION, PROMPT, make_trajectory
    from test_learner_training import learner_dist  # noqa: F401


class Remote:
    """Calls ``obj``'s methods the way the driver calls a Ray actor's: ``x.method.remote(...)``."""

    def __init__(self, obj):
        self._obj = obj

    def __getattr__(self, name):
        method = getattr(self._obj, name)

        class _Method:
            @staticmethod
            def remote(*args, **kwargs):
                async def call():
                    result = method(*args, **kwargs)
                    return await result if inspect.isawaitable(result) else result
                return call()
        return _Method


class FakeGenerator:
    """Serves one version at a time and refuses a swap that is not newer (as VLLMPolicy does)."""

    def __init__(self):
        self.version = 0
        self.swaps: list[tuple[str, int]] = []
        self.count = 0

    def _swap(self, how: str, version: int) -> float:
        assert version > self.version, f"{how}: version {version} is not newer than the served {self.version}"
        self.version = version
        self.swaps.append((how, version))
        return 0.0

    def load_folder(self, path: str, version: int) -> float:
        return self._swap(f"load {path}", version)

    def update_weights(self, buckets, version: int) -> float:
        return self._swap("push", version)

    def episode(self, version: int | None = None):
        """A two-turn episode generated at the served version (or ``version``: one still in flight)."""
        self.count += 1
        v = self.version if version is None else version
        turns = [([20 + self.count % 7, 21, 22], [-1.1, -0.9, -1.3], v), ([23, 24], [-0.7, -1.2], v)]
        return make_trajectory(f"ep{self.count}", PROMPT, turns, OBSERVATION, reward=float(self.count % 3) - 1.0)


class FakeLearnerGroup:
    """One rank running a real PPOTrainer in this process; stage folders name their warm-up."""

    world_size = 1

    def __init__(self, model_dir: Path, warmup: dict[str, int]):
        self.model_dir, self.warmup = model_dir, warmup
        self.trainer = None

    async def call(self, method: str, *args):
        if method == "setup":
            from learner.ppo import PPOTrainer

            kind, stage_dir = args[0], Path(args[1])
            assert kind == "ppo"
            cfg = LearnerConfig(lr=1e-2, critic_lr=1e-3, warmup_steps=0, lr_schedule=LRSchedule.constant,
                                grad_checkpointing=False, micro_batch_tokens=256,
                                critic_warmup_steps=self.warmup[stage_dir.name])
            self.trainer = PPOTrainer.create(cfg, self.model_dir, total_steps=4)
            return {}  # no checkpoint: a fresh stage
        if method == "export_weights":
            return []
        if method == "save":
            return ""
        raise AssertionError(f"unexpected learner call {method}")

    async def step(self, refs, sizes, weights, version=0, episode_advantages=None):
        return StepResult(self.trainer.step(refs, weights, version=version, episode_advantages=episode_advantages))


def test_a_new_stage_sees_the_served_version_and_critic_warmup_bumps_nothing(tiny_model_dir, learner_dist, tmp_path):
    torch.manual_seed(3)
    cfg = OmegaConf.structured(Config)
    cfg.stage.sync_every, cfg.stage.checkpoint_every = 1, 100
    generator = FakeGenerator()
    queue = TrajectoryQueue(capacity=16, max_staleness=0)  # any staleness drops: the strictest buffer
    learner = FakeLearnerGroup(tiny_model_dir, {"single_turn_ppo": 0, "agentic_ppo": 2})
    system = System([], Remote(queue), [Remote(generator)], learner)
    state = RecipeState(policy="base")

    async def train(episodes, step, steps):
        metrics = {"learner": (await system.train_step(episodes, [e.num_tokens for e in episodes], [1.0] * len(episodes))).metrics}
        await after_step(cfg, system, step, steps, metrics)
        return metrics["learner"]

    async def run():
        # Stage 1: three policy steps, a push after each but the last (the next stage serves the export).
        assert await setup_learner("ppo", tmp_path / "single_turn_ppo", system, state, "base", 3) == 0
        for step in range(3):
            m = await train([generator.episode(), generator.episode()], step, 3)
            assert m["stale_fraction"] == 0.0 and m["version"] == step
        assert (system.version, system.served, generator.version) == (3, 2, 2)
        in_flight = generator.episode()  # generated at version 2, still running when the stage ends
        state.version, state.policy = system.version, str(tmp_path / "single_turn_ppo/export/policy")

        # Stage 2: a new trainer, two critic-only warm-up steps.
        assert await setup_learner("ppo", tmp_path / "agentic_ppo", system, state, "base", 4) == 0
        assert generator.swaps[-1] == (f"load {state.policy}", 3), "the export is served as the version it is"
        assert (system.version, system.served, queue.stats().version) == (3, 3, 3)
        swaps = len(generator.swaps)
        m = await train([in_flight, generator.episode(), generator.episode()], 0, 4)
        assert m["policy_trained"] == 0.0 and m["version"] == 3
        assert m["stale_fraction"] == pytest.approx(1 / 3), (
            f"the version-2 episode is a third of the tokens and stale to the new trainer: {m['stale_fraction']}")
        fresh = generator.episode()  # version 3, in flight during the warm-up
        m = await train([generator.episode(), generator.episode()], 1, 4)
        assert m["policy_trained"] == 0.0 and m["stale_fraction"] == 0.0
        assert (system.version, system.served, len(generator.swaps)) == (3, 3, swaps), \
            "a critic warm-up step changed no weights: no new version, no push"
        assert await queue.put(TrajectoryMeta.of(fresh), "ref") == "accepted", \
            "an episode of the served policy must not be dropped as stale after warm-up steps"

        # The first policy step: the version moves, and the push carries it.
        m = await train([generator.episode(), generator.episode()], 2, 4)
        assert m["policy_trained"] == 1.0 and m["version"] == 3
        assert (system.version, system.served, generator.swaps[-1]) == (4, 4, ("push", 4))
        assert queue.stats().version == 4
        m = await train([fresh, generator.episode()], 3, 4)
        assert m["version"] == 4 and 0.0 < m["stale_fraction"] < 1.0, "the version-3 episode is stale now"

    asyncio.run(run())
