"""The learning check (`cuda-agent train learn-check`): the whole system makes a policy better.

Each run is the shipped config through `launch.train.train`: the vLLM generator (CPU build)
running the episode loop against the verifier's Ray actor (env.kind=verifier), trajectories in
the object store behind the buffer, the DeepSpeed learner, and the learner's weights pushed into
the running generator after every step. The tasks ask for "yes" or "no" in answer.txt; the
primed model (launch/primed_model.py) writes the asked word about half the time, so the mean
reward (+1 asked word, -1 otherwise) starts near 0.

What each run proves, and what would fail it:
- synchronous: the expected reward of the policy the run exported rises by MARGIN over the primed
  model's, and every question prefers its asked word (a learner that does not learn); every
  step's importance weight is 1 within 0.01 and every step's episodes carry the version of the
  step before (a weight push that relabels the generator without loading the weights leaves them
  behind their label, and the learner's ratio with the sampler's logprobs moves off 1); no
  episode is trained twice and none is dropped as stale;
- control: the verifier rewards the other word, and the policy moves the other way: its expected
  reward under that verifier rises and every question prefers the word it was not asked for (a
  sign error in the advantages or the loss would move both runs the same way);
- asynchronous: generation goes on while the learner trains, and the expected reward rises too
  (at half the rate, over twice the steps: configs/learn-check-async.yaml).
The sampled reward by step is printed beside them (see MARGIN for why it is not the statistic).

Measured on the 2-core CPU machine shared with other work (load average 8-10), 2026-11-26:
see README's "The learning check" for the figures.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from configs.load import load_config
from launch.primed_model import answer_preference, expected_reward, preference_change

# 9-14 minutes a synchronous run on the 2-core machine, 25 minutes the asynchronous one (24 steps of
# ~60 s, 2026-11-27): well past pytest's default limit of 900 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2700)]

# The statistic is noise-free given the weights: each question's asked-word preference (the log-odds
# of the asked word's call over the other's, teacher-forced: launch/primed_model.answer_preference)
# and the expected reward it implies over the two well-formed answers (expected_reward), for the
# primed model and for the policy the run exported. A step's sampled reward is a mean of 8 ±1
# episodes: the 3-step means the issue first named moved by 0.25 between two runs of the same seeds,
# and failed a run that had learned (+0.42 -> +0.58, 2026-11-27), so they are reported, not asserted.
# Measured (2026-11-27, CPU): synchronous, preferences yes +1.15 -> +4.10, no -1.82 -> +2.65; the
# expected reward -0.10 -> +0.92 (README: the learning check).
MARGIN = 0.25  # the expected reward's rise, reward units (+1/-1): 12.5 points of accuracy
ASYNC_MARGIN = 0.25  # asynchronous steps train on episodes up to one version old


@dataclass
class Check:
    steps: list[dict]  # metrics.jsonl
    episodes: list[dict]  # episodes.jsonl
    wall: float  # seconds, train() whole
    before: dict[str, float]  # answer_preference of the primed model, per task
    after: dict[str, float]  # ... of the policy the run exported


def run_check(tmp_path: Path, *overrides: str, configs: tuple[str, ...] = ("learn-check",)) -> Check:
    from launch.embedded_model import resolve_model_path
    from launch.train import train

    cfg = load_config(list(configs), [f"logging.out_dir={tmp_path}", "logging.progress=false", *overrides])
    started = time.monotonic()
    out = train(cfg)
    wall = time.monotonic() - started
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert (out / "reward.png").is_file(), "no reward plot was written"
    before = answer_preference(resolve_model_path(cfg.model.path, cfg.model.cache_dir))
    after = answer_preference(out / cfg.stage.name / "export" / "policy")
    return Check(steps, episodes, wall, before, after)


def shown(check: Check, inverted: bool = False) -> str:
    return (f"reward {curve(check.steps)} (first 3 -> last 3: {rise(check.steps):+.2f}); "
            f"{preference_change(check.before, check.after, inverted)}")


def gain(check: Check, inverted: bool = False) -> float:
    """How much the expected reward rose, from the primed model to the exported policy."""
    return expected_reward(check.after, inverted) - expected_reward(check.before, inverted)


def rise(steps: list[dict]) -> float:
    rewards = [s["reward/mean"] for s in steps]
    return sum(rewards[-3:]) / 3 - sum(rewards[:3]) / 3


def curve(steps: list[dict]) -> str:
    return " ".join(f"{s['reward/mean']:+.2f}" for s in steps)


def test_synchronous_learning_check_raises_the_reward_on_the_weights_it_pushed(tmp_path, capsys):
    check = run_check(tmp_path)
    steps, episodes, wall = check.steps, check.episodes, check.wall
    with capsys.disabled():
        print(f"\n[timing] learn-check synchronous: {len(steps)} steps in {wall:.0f} s; {shown(check)}")
    assert len(steps) == 12
    assert gain(check) >= MARGIN, f"the expected reward did not rise by {MARGIN}: {shown(check)}"
    assert all(p > 0 for p in check.after.values()), f"a question does not prefer its asked word: {shown(check)}"
    for s in steps:
        weight = s["learner/importance_weight"]
        assert abs(weight - 1.0) <= 0.01, f"step {s['step']}: importance weight {weight}: the sampler's weights are not the learner's"
    for e in episodes:
        assert e["versions"] == [e["step"] - 1], f"step {e['step']} trained an episode of versions {e['versions']}"
    ids = [e["episode_id"] for e in episodes]
    assert len(ids) == len(set(ids)) == 12 * 8, "an episode was trained twice, or a step trained fewer than its batch"
    last = steps[-1]
    assert last["buffer/dropped_stale"] == 0 and last["buffer/downweighted"] == 0, "a synchronous episode was stale"


def test_control_run_rewarding_the_other_word_moves_the_policy_the_other_way(tmp_path, capsys):
    check = run_check(tmp_path, "env.verifier.inverted=true")
    with capsys.disabled():
        print(f"\n[timing] learn-check control (inverted verifier): {len(check.steps)} steps in {check.wall:.0f} s; "
              f"{shown(check, inverted=True)}")
    # A sign error in the advantages or the loss would move both runs toward the same word, or neither.
    assert gain(check, inverted=True) >= MARGIN, f"the control's expected reward did not rise by {MARGIN}: {shown(check, True)}"
    assert all(p < 0 for p in check.after.values()), f"a question still prefers its asked word: {shown(check, True)}"


def test_asynchronous_learning_check_raises_the_reward_too(tmp_path, capsys):
    check = run_check(tmp_path, configs=("learn-check", "learn-check-async"))
    steps, episodes = check.steps, check.episodes
    with capsys.disabled():
        print(f"\n[timing] learn-check asynchronous: {len(steps)} steps in {check.wall:.0f} s; {shown(check)}")
    assert gain(check) >= ASYNC_MARGIN, f"the expected reward did not rise by {ASYNC_MARGIN}: {shown(check)}"
    ids = [e["episode_id"] for e in episodes]
    assert len(ids) == len(set(ids)), "an episode was trained twice"
