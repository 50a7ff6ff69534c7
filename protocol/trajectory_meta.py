"""TrajectoryMeta: what travels instead of a trajectory, everything but its tokens.

A generator puts a trajectory into the object store and sends this beside the reference
(actors/buffer_client.push). The buffer judges staleness and forms batches from it, and the
driver forms groups, filters for RFT, computes GRPO's advantages, the step's metrics and its
audit lines from it (actors/batches.py): only the learner's ranks ever fetch the tokens, once.
So every number about an episode that a decision above the learner needs is measured here,
when the trajectory is made: its versions, its turns, and RFT's two measures of its tool use.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

from protocol.trajectory import Trajectory

LOOP_PERIODS = 4  # the longest cycle of turns looked for (A, B, A, B is a loop of period 2)


def invalid_call_rate(traj: Trajectory) -> float:
    """Malformed or unknown tool calls over the calls attempted (0 when it made none).

    A call that parsed but was refused counts once in each: it is in ``tools`` and in
    ``invalid_calls`` (one valid and one refused call once read 0.33, not 0.5)."""
    invalid = sum(t.invalid_calls for t in traj.turns)
    total = sum(t.calls or len(t.tools) for t in traj.turns)  # ``calls`` 0: a trajectory recorded before it was kept
    return min(1.0, invalid / total) if total else (1.0 if invalid else 0.0)


def longest_repeat(traj: Trajectory) -> int:
    """How many times in a row the episode repeated one action or one cycle of actions (up to
    LOOP_PERIODS turns long): 1 when nothing repeats. An action is the turn's generated text, or
    its tokens when no text was kept. A, A, A is 3; A, B, A, B, A, B is 3 too (a loop of two
    turns, which consecutive-turn equality alone never saw)."""
    actions = [turn.text.strip() if turn.text.strip() else tuple(traj.segments[turn.segment].token_ids[turn.start:turn.end])
               for turn in traj.turns]
    longest = 1 if actions else 0
    for period in range(1, LOOP_PERIODS + 1):
        run = 0  # consecutive turns equal to the one ``period`` before
        for k in range(period, len(actions)):
            run = run + 1 if actions[k] == actions[k - period] else 0
            longest = max(longest, 1 + run // period)
    return longest


@dataclass
class TrajectoryMeta:
    """A trajectory's numbers: enough to judge, batch, group, filter and report it, small enough to send."""

    episode_id: str
    task_id: str
    versions: list[int]  # every turn's policy version, sorted, each once (never empty: see ``of``)
    num_tokens: int  # all tokens of all segments: what the learner processes
    num_generated: int  # tokens under the loss mask
    reward: float
    milestone: int
    stop_reason: str = "submit"
    judged: bool = True  # Trajectory.judged: False when the environment failed to judge it (never trained on)
    turns: int = 0  # agent turns
    token_level: bool = True  # Trajectory.token_level: False for a chat-only policy's (nothing to train on)
    invalid_call_rate: float = 0.0  # RFT's filter (learner/rft.py): invalid_call_rate above
    longest_repeat: int = 0  # RFT's filter: longest_repeat above

    @classmethod
    def of(cls, trajectory: Trajectory, version: int | None = None) -> "TrajectoryMeta":
        """The trajectory's meta; ``version`` is needed (and used) only when it has no turns."""
        versions = trajectory.versions or ([] if version is None else [version])
        if not versions:
            raise ValueError(f"trajectory {trajectory.episode_id} has no turns, so no policy version: pass version=")
        return cls(trajectory.episode_id, trajectory.task_id, sorted(set(versions)), trajectory.num_tokens,
                   trajectory.num_generated, trajectory.reward, trajectory.milestone, trajectory.stop_reason,
                   trajectory.judged, len(trajectory.turns), trajectory.token_level,
                   invalid_call_rate(trajectory), longest_repeat(trajectory))

    @property
    def version_min(self) -> int:
        """The oldest policy version among its turns."""
        return self.versions[0]

    @property
    def version_max(self) -> int:
        """The newest."""
        return self.versions[-1]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TrajectoryMeta":
        return cls(**d)
