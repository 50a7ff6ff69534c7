"""A learner step's record in metrics.jsonl: the names every reader shares (plots, the report,
the live display, tests) and the episode metrics the step computes.

The step (actors/batches.py) writes these keys; launch/metrics.py writes the record to JSONL and
TensorBoard; launch/plots.py, launch/report.py and launch/progress.py read them back.
"""
from __future__ import annotations

from typing import Any, Iterable

REWARD = "reward/mean"
REWARD_MIN = "reward/min"
REWARD_MAX = "reward/max"
MILESTONE_RATES = {  # fraction of the step's episodes that reached at least this milestone
    "correct": "milestone/correct",
    "faster than eager": "milestone/faster_than_eager",
    "faster than torch.compile": "milestone/faster_than_compile",
}


def milestone_rates(env_kind: str = "kernel") -> dict[str, str]:
    """The milestones an environment kind pays: all three for kernels; only "correct" (the asked
    word) for the learning check's verifier, whose speed columns would read 0% for ever."""
    return dict(MILESTONE_RATES) if env_kind == "kernel" else {"correct": MILESTONE_RATES["correct"]}


TOKENS_PER_S = "throughput/tokens_per_s"
ENV_QUEUE = "env/queue_depth"
BUFFER_DEPTH = "buffer/depth"
STALENESS = "buffer/staleness_mean"
SKIPPED = "step/skipped"  # why a step trained nothing (RFT's filter or dynamic sampling left too few episodes); absent when it trained


def episode_metrics(episodes: Iterable[Any]) -> dict[str, float]:
    """Reward and milestone rates of a step's episodes (anything with ``reward`` and ``milestone``)."""
    episodes = list(episodes)
    if not episodes:
        return {"episodes": 0}
    rewards = [float(e.reward) for e in episodes]
    out = {"episodes": len(episodes), REWARD: sum(rewards) / len(rewards), REWARD_MIN: min(rewards), REWARD_MAX: max(rewards)}
    for level, key in enumerate(MILESTONE_RATES.values(), start=1):
        out[key] = sum(int(e.milestone) >= level for e in episodes) / len(episodes)
    return out
