"""GroupAssembler: whole groups of episodes out of the buffer's batches.

With ``stage.group_size`` > 1 the sampler hands out each task that many times in a row, under
one group key (actors/feeder.py). The buffer serves episodes as they finish, so a batch may hold
part of a group; its members wait here until the group is complete, because a group-relative
advantage or a dynamic-sampling verdict on part of a group would judge the wrong baseline.

A group that stays incomplete (a member dropped as stale, or lost with its generator twice) is
released as it is after ``max_wait`` draws: a smaller group still has a baseline, and waiting
for a member that will never come would hold its siblings forever.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from learner.groups import informative_groups


@dataclass
class _Waiting:
    first_draw: int
    members: list[tuple[Any, Any]] = field(default_factory=list)  # (buffer item, its TrajectoryMeta)


@dataclass
class Assembled:
    ready: list[tuple[Any, Any]]  # (buffer item, its TrajectoryMeta) of complete groups, group by group
    groups: list[str]  # the group key of each ready pair
    dropped_uniform: int = 0  # episodes in groups whose rewards all agreed (dynamic sampling)
    released_incomplete: int = 0  # groups released with fewer than group_size members


class GroupAssembler:
    def __init__(self, group_size: int, group_of: Callable[[str], str], dynamic_sampling: bool, max_wait: int = 8):
        if group_size < 1:
            raise ValueError(f"stage.group_size must be at least 1, got {group_size}")
        self.group_size, self.group_of, self.dynamic, self.max_wait = group_size, group_of, dynamic_sampling, max_wait
        self.waiting: dict[str, _Waiting] = {}
        self.draws = 0

    @property
    def waiting_episodes(self) -> int:
        return sum(len(w.members) for w in self.waiting.values())

    def add(self, pairs: list[tuple[Any, Any]]) -> Assembled:
        """Take one draw of (buffer item, its TrajectoryMeta) pairs; return the groups it completed."""
        self.draws += 1
        for item, traj in pairs:
            key = self.group_of(traj.episode_id)
            self.waiting.setdefault(key, _Waiting(self.draws)).members.append((item, traj))
        out = Assembled([], [])
        for key in list(self.waiting):
            w = self.waiting[key]
            complete = len(w.members) >= self.group_size
            if not complete and self.draws - w.first_draw < self.max_wait:
                continue
            del self.waiting[key]
            out.released_incomplete += not complete
            if self.dynamic and not informative_groups([t.reward for _, t in w.members], [key] * len(w.members))[0]:
                out.dropped_uniform += len(w.members)
                continue
            out.ready.extend(w.members)
            out.groups.extend([key] * len(w.members))
        return out
