"""Trajectory: one agent episode, token by token, as the model saw it.

The contract between the agent (rollout/) and the learner (learner/). A trajectory is a list
of *segments*; a segment is one token sequence exactly as it sat in the model's context.
Most episodes have one segment. When the context nears its budget, the episode loop elides
old observations and continues in a new segment, so that no recorded token was ever absent
from what the model attended to (the learner trains each segment as its own sequence).

Per token: the id, a loss mask (1 only on tokens the policy sampled; prompt, tool output and
chat-template glue are 0) and the sampling logprob from the inference engine (0.0 where the
mask is 0). Logprobs come from the sampler, not a recomputation, because PPO's ratio needs the
behaviour policy's probabilities, and a recomputation under different kernels or precision
is a different policy.

Per turn: where its generated tokens lie, the policy version that generated them (weights
are hot-swapped mid-episode, so versions can differ within one trajectory), the tool calls
and what the environment said, and an optional per-turn milestone reward.

Chat-only policies (an OpenAI-compatible endpoint) see messages, not tokens: their
trajectories have ``token_level = False`` and empty segments, and are for evaluation only.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import msgpack

STOP_REASONS = (
    "submit",  # the agent called submit; the protected final evaluation set the reward
    "max_turns",  # the turn budget ran out
    "context",  # the context budget ran out and nothing more could be elided
    "timeout",  # the wall-clock budget ran out
    "model_stop",  # the model ended its turn without a tool call too many times in a row
    "error",  # the episode failed for an infrastructure reason (see Trajectory.error)
)


class TrajectoryError(ValueError):
    """A trajectory that breaks an invariant; the message names the field."""


@dataclass
class ToolCall:
    """One call the model asked for, as parsed from its output."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = ""  # the endpoint's call id (OpenAI function calling); empty for text formats


@dataclass
class Segment:
    """One context as the model saw it: token ids, loss mask, sampling logprobs."""

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)  # 1: sampled by the policy; 0: everything else
    logprobs: list[float] = field(default_factory=list)  # sampling logprob where mask is 1, else 0.0

    def __len__(self) -> int:
        return len(self.token_ids)

    def extend(self, token_ids: list[int], generated: bool, logprobs: list[float] | None = None) -> None:
        """Append tokens; generated ones need their sampling logprobs."""
        if generated and (logprobs is None or len(logprobs) != len(token_ids)):
            raise TrajectoryError("generated tokens need one sampling logprob each")
        self.token_ids.extend(int(t) for t in token_ids)
        self.loss_mask.extend([1 if generated else 0] * len(token_ids))
        self.logprobs.extend([float(x) for x in logprobs] if generated else [0.0] * len(token_ids))


@dataclass
class Turn:
    """One model turn: its generated span and what came of it."""

    segment: int  # index into Trajectory.segments
    start: int  # first generated token of the turn, within the segment
    end: int  # one past its last generated token
    version: int  # policy version that generated the turn
    text: str = ""  # the generated text, decoded (for transcripts)
    tools: list[str] = field(default_factory=list)  # names of the tools called, in order
    invalid_calls: int = 0  # malformed or unknown calls in this turn (each got an explaining observation)
    calls: int = 0  # calls the turn attempted: those parsed (in ``tools``) and those that did not parse
    summary: str = ""  # one line per call: what the tool or environment answered
    reward: float = 0.0  # milestone reward this turn's evaluation reached (used when per-turn rewards are on)
    gen_s: float = 0.0  # seconds spent generating
    tool_s: float = 0.0  # seconds spent in tools and the environment


@dataclass
class Trajectory:
    episode_id: str
    task_id: str
    segments: list[Segment] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the transcript, role and content
    token_level: bool = True  # False for chat-only policies: segments are empty, evaluation only
    milestone: int = 0  # protocol.results.Milestone of the final evaluation
    reward: float = 0.0  # the episode's reward (the final evaluation's)
    stop_reason: str = "submit"  # one of STOP_REASONS
    error: str = ""  # why, when stop_reason is "error"
    final_eval: dict[str, Any] | None = None  # EvalResult.to_dict() of the protected final evaluation
    elisions: int = 0  # times old observations were elided to fit the context budget
    wall_s: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)  # sampling settings, backend, seed, ...

    @property
    def judged(self) -> bool:
        """Whether the environment judged the outcome: False after an infrastructure error, or a final
        evaluation that failed for the environment's own reason (infra). Its reward says nothing of the policy."""
        return self.stop_reason != "error" and (self.final_eval or {}).get("failure") != "infra"

    def __post_init__(self) -> None:
        self.segments = [s if isinstance(s, Segment) else Segment(**s) for s in self.segments]
        self.turns = [t if isinstance(t, Turn) else Turn(**t) for t in self.turns]
        self.validate()

    # -- invariants ---------------------------------------------------------------------

    def validate(self) -> None:
        """Raise TrajectoryError naming the first broken invariant."""
        if self.stop_reason not in STOP_REASONS:
            raise TrajectoryError(f"stop_reason must be one of {STOP_REASONS}, got {self.stop_reason!r}")
        if not math.isfinite(self.reward):
            raise TrajectoryError(f"reward must be finite, got {self.reward}")
        if not 0 <= self.milestone <= 3:
            raise TrajectoryError(f"milestone must be 0-3, got {self.milestone}")
        if not self.token_level:
            if any(len(s) for s in self.segments):
                raise TrajectoryError("a chat-only trajectory (token_level=False) carries no tokens")
            return
        for i, seg in enumerate(self.segments):
            _check_segment(i, seg)
        self._check_turns()

    def _check_turns(self) -> None:
        generated = [[0] * len(s) for s in self.segments]
        last = (-1, -1)
        for k, turn in enumerate(self.turns):
            if not 0 <= turn.segment < len(self.segments):
                raise TrajectoryError(f"turns[{k}].segment {turn.segment} is out of range")
            if not 0 <= turn.start <= turn.end <= len(self.segments[turn.segment]):
                raise TrajectoryError(f"turns[{k}] span [{turn.start}, {turn.end}) is outside its segment")
            if (turn.segment, turn.start) < last:
                raise TrajectoryError(f"turns[{k}] starts before the previous turn ends")
            last = (turn.segment, turn.end)
            generated[turn.segment][turn.start:turn.end] = [1] * (turn.end - turn.start)
        for i, seg in enumerate(self.segments):
            if seg.loss_mask != generated[i]:
                first = next(j for j, (a, b) in enumerate(zip(seg.loss_mask, generated[i])) if a != b)
                raise TrajectoryError(
                    f"segments[{i}].loss_mask disagrees with the turns' generated spans at token {first}: "
                    "the mask must be 1 exactly on tokens the policy generated"
                )

    # -- derived ------------------------------------------------------------------------

    @property
    def num_tokens(self) -> int:
        return sum(len(s) for s in self.segments)

    @property
    def num_generated(self) -> int:
        return sum(sum(s.loss_mask) for s in self.segments)

    @property
    def invalid_calls(self) -> int:
        return sum(t.invalid_calls for t in self.turns)

    @property
    def versions(self) -> list[int]:
        return [t.version for t in self.turns]

    # -- serialisation ------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
        return cls(**d)

    def pack(self) -> bytes:
        return msgpack.packb(self.to_dict(), use_bin_type=True)

    @classmethod
    def unpack(cls, data: bytes) -> "Trajectory":
        return cls.from_dict(msgpack.unpackb(data, raw=False, strict_map_key=False))


def _check_segment(i: int, seg: Segment) -> None:
    n = len(seg.token_ids)
    if len(seg.loss_mask) != n or len(seg.logprobs) != n:
        raise TrajectoryError(
            f"segments[{i}]: token_ids, loss_mask and logprobs must have one entry per token "
            f"(got {n}, {len(seg.loss_mask)}, {len(seg.logprobs)})"
        )
    for j, (tok, m, lp) in enumerate(zip(seg.token_ids, seg.loss_mask, seg.logprobs)):
        if not isinstance(tok, int) or tok < 0:
            raise TrajectoryError(f"segments[{i}].token_ids[{j}] must be a non-negative int, got {tok!r}")
        if m not in (0, 1):
            raise TrajectoryError(f"segments[{i}].loss_mask[{j}] must be 0 or 1, got {m!r}")
        if m == 1 and not (math.isfinite(lp) and lp <= 0.0):
            raise TrajectoryError(f"segments[{i}].logprobs[{j}] must be a finite log-probability <= 0, got {lp}")
        if m == 0 and lp != 0.0:
            raise TrajectoryError(f"segments[{i}].logprobs[{j}] must be 0.0 where the loss mask is 0, got {lp}")
