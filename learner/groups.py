"""Group sampling: several episodes of one task in a step, judged against each other.

A group is the episodes of one task sampled together (``stage.group_size``). Two uses:

- Group-relative advantages (GRPO, Shao et al. 2024): an episode's advantage is its reward
  minus its group's mean, over the group's standard deviation, on every generated token. The
  group is the baseline, so no critic is needed for it; it sits beside the critic's GAE as
  ``learner.advantage``.
- Dynamic sampling (DAPO, Yu et al. 2025): a group whose rewards all agree (every episode
  failed, or every one reached the same milestone) has a group-relative advantage of 0 on every
  token: it costs a learner step's compute and teaches nothing, so it is dropped.

Both need the whole group at once, so they run where the whole batch is (the driver), before
the batch is dealt over the learner's ranks; the learner receives one number per episode.
"""
from __future__ import annotations

import math
from collections import defaultdict


def _members(groups: list[str]) -> dict[str, list[int]]:
    members: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    return members


def group_advantages(rewards: list[float], groups: list[str], eps: float = 1e-6) -> list[float]:
    """(reward - group mean) / (group std + eps) per episode; the std is the population std,
    so a group of one, or of equal rewards, gives 0 (no signal, not a division by zero)."""
    if len(rewards) != len(groups):
        raise ValueError(f"{len(rewards)} rewards for {len(groups)} group keys: pass one key per episode")
    out = [0.0] * len(rewards)
    for idx in _members(groups).values():
        values = [float(rewards[i]) for i in idx]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        for i in idx:
            out[i] = (float(rewards[i]) - mean) / (std + eps)
    return out


def informative_groups(rewards: list[float], groups: list[str], tolerance: float = 1e-9) -> list[bool]:
    """Per episode: whether its group's rewards differ (keep it) or all agree (dynamic sampling drops it)."""
    if len(rewards) != len(groups):
        raise ValueError(f"{len(rewards)} rewards for {len(groups)} group keys: pass one key per episode")
    keep = [False] * len(rewards)
    for idx in _members(groups).values():
        values = [float(rewards[i]) for i in idx]
        varied = max(values) - min(values) > tolerance
        for i in idx:
            keep[i] = varied
    return keep
