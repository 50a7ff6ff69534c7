"""What a run sets up from its config before the actors start: the seed, and the critic it starts from."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from actors.seeding import derived_seed, seed_process
from configs.load import ConfigError
from launch.train import RecipeState, critic_folder


def draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_the_seed_makes_python_numpy_and_torch_draw_the_same_again():
    seed_process(7)
    first = draws()
    seed_process(7)
    assert draws() == first
    seed_process(8)
    assert draws() != first


def test_each_actor_gets_its_own_seed_the_same_in_every_run():
    seeds = {derived_seed(0, role, i) for role in ("generator", "learner") for i in range(4)}
    assert len(seeds) == 8, "two actors drew the same stream"
    assert derived_seed(0, "learner", 1) == derived_seed(0, "learner", 1) != derived_seed(1, "learner", 1)
    assert all(0 <= s < 2**32 for s in seeds)  # NumPy's limit


def test_model_critic_path_must_be_a_model_folder_and_is_the_critic_the_recipe_starts_from(tmp_path):
    assert critic_folder(None) is None and critic_folder("") is None
    with pytest.raises(ConfigError, match="model.critic_path .*no config.json"):
        critic_folder(str(tmp_path / "missing"))
    critic = tmp_path / "value_pretrain" / "export" / "critic"
    critic.mkdir(parents=True)
    (critic / "config.json").write_text("{}")
    folder = critic_folder(str(critic))
    assert folder == str(critic.resolve())
    run = tmp_path / "run"
    run.mkdir()
    state = RecipeState.load(run, "policy-folder", resume=True, critic=folder)
    assert (state.policy, state.critic) == ("policy-folder", folder)
    state.critic = str(run / "agentic_ppo" / "export" / "critic")  # a finished stage exported its own
    state.save(run)
    assert RecipeState.load(run, "policy-folder", resume=True, critic=folder).critic == state.critic  # a rerun resumes it
