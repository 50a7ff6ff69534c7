"""The learning check (`cuda-agent train learn-check`): the whole system makes a policy better.

Each run is the shipped config through `launch.train.train`: the vLLM generator (CPU build)
running the episode loop against the verifier's Ray actor (env.kind=verifier), trajectories in
the object store behind the buffer, the DeepSpeed learner, and the learner's weights pushed into
the running generator after every step. The tasks ask for "yes" or "no" in answer.txt; the
primed model (launch/primed_model.py) writes the asked word about half the time, so the mean
reward (+1 asked word, -1 otherwise) starts near 0.

What each run proves, and what would fail it:
- synchronous: the reward rises by MARGIN (a learner that does not learn, or a weight push that
  relabels the generator's version without loading the weights: the generator would sample from
  the primed model throughout); every step's importance weight is 1 within 0.01 and every step's
  episodes carry the version of the step before (a push that relabels without loading leaves
  the weights behind their label, and the learner's ratio with the sampler's logprobs moves off
  1); no episode is trained twice and none is dropped as stale;
- control: the verifier rewards the other word, and the reward rises there too: the policy moved
  toward writing the word it was not asked for, the other way (a sign error in the advantages
  or the loss would lower both runs' reward);
- asynchronous: generation goes on while the learner trains, and the reward rises too.

Measured on the 2-core CPU machine shared with other work (load average 8-10), 2026-11-26:
see README's "The learning check" for the figures.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from configs.load import load_config

# 11-14 minutes a run on the busy 2-core machine (the asynchronous run slower: at 6 of 12 steps after
# 900 s, pytest's default limit, under a load average of 7 to 12): well past that default.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2700)]

# Reward units (+1/-1): the last three steps' mean over the first three's; 0.25 is 12.5 points of
# accuracy. Measured (2026-11-26, one seed): synchronous +0.42 and +0.67 (two runs), control +0.67. A step's mean of 8
# episodes moves in quarters, so the difference of two 3-step means has a spread of about 0.25:
# the margin sits below what was measured, not at it (README: the learning check).
MARGIN = 0.25
ASYNC_MARGIN = 0.25  # asynchronous steps train on episodes up to one version old


def run_check(tmp_path: Path, *overrides: str) -> tuple[list[dict], list[dict], float]:
    from launch.train import train

    cfg = load_config(["learn-check"], [f"logging.out_dir={tmp_path}", "logging.progress=false", *overrides])
    started = time.monotonic()
    out = train(cfg)
    wall = time.monotonic() - started
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert (out / "reward.png").is_file(), "no reward plot was written"
    return steps, episodes, wall


def rise(steps: list[dict]) -> float:
    rewards = [s["reward/mean"] for s in steps]
    return sum(rewards[-3:]) / 3 - sum(rewards[:3]) / 3


def curve(steps: list[dict]) -> str:
    return " ".join(f"{s['reward/mean']:+.2f}" for s in steps)


def test_synchronous_learning_check_raises_the_reward_on_the_weights_it_pushed(tmp_path, capsys):
    steps, episodes, wall = run_check(tmp_path)
    with capsys.disabled():
        print(f"\n[timing] learn-check synchronous: {len(steps)} steps in {wall:.0f} s; reward {curve(steps)}")
    assert len(steps) == 12
    assert rise(steps) >= MARGIN, f"the reward did not rise by {MARGIN}: {curve(steps)}"
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
    steps, episodes, wall = run_check(tmp_path, "env.verifier.inverted=true")
    with capsys.disabled():
        print(f"\n[timing] learn-check control (inverted verifier): {len(steps)} steps in {wall:.0f} s; "
              f"reward {curve(steps)}")
    # Every answer is well formed after priming, so a rising reward here is a falling rate of the asked word.
    assert rise(steps) >= MARGIN, f"the control's reward did not rise by {MARGIN}: {curve(steps)}"


def test_asynchronous_learning_check_raises_the_reward_too(tmp_path, capsys):
    steps, episodes, wall = run_check(tmp_path, "stage.asynchronous=true")
    with capsys.disabled():
        print(f"\n[timing] learn-check asynchronous: {len(steps)} steps in {wall:.0f} s; reward {curve(steps)}")
    assert rise(steps) >= ASYNC_MARGIN, f"the reward did not rise by {ASYNC_MARGIN}: {curve(steps)}"
    ids = [e["episode_id"] for e in episodes]
    assert len(ids) == len(set(ids)), "an episode was trained twice"
