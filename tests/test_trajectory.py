"""Trajectory invariants and the msgpack round trip."""
from __future__ import annotations

import pytest

from protocol.trajectory import Segment, ToolCall, Trajectory, TrajectoryError, Turn


def two_turn_trajectory() -> Trajectory:
    seg = Segment()
    seg.extend([5, 6, 7], generated=False)  # prompt
    seg.extend([8, 9], generated=True, logprobs=[-0.5, -1.25])  # turn 0
    seg.extend([10], generated=False)  # observation
    seg.extend([11, 12, 2], generated=True, logprobs=[-0.1, -2.0, -0.01])  # turn 1
    turns = [
        Turn(segment=0, start=3, end=5, version=0, tools=["compile"], summary="compile: ok"),
        Turn(segment=0, start=6, end=9, version=1, tools=["submit"], reward=2.0),
    ]
    return Trajectory(
        episode_id="ep-1", task_id="level1/01_gelu", segments=[seg], turns=turns,
        messages=[{"role": "user", "content": "hi"}], milestone=2, reward=2.0, meta={"seed": 3},
    )


def test_round_trip_is_lossless():
    traj = two_turn_trajectory()
    back = Trajectory.unpack(traj.pack())
    assert back == traj
    assert back.num_generated == 5 and back.num_tokens == 9 and back.versions == [0, 1]


def test_mask_must_match_turn_spans():
    traj = two_turn_trajectory()
    d = traj.to_dict()
    d["turns"][1]["end"] = 8  # the last generated token no longer belongs to a turn
    with pytest.raises(TrajectoryError, match="loss_mask disagrees .* at token 8"):
        Trajectory.from_dict(d)


def test_lengths_must_agree():
    d = two_turn_trajectory().to_dict()
    d["segments"][0]["logprobs"].pop()
    with pytest.raises(TrajectoryError, match="one entry per token"):
        Trajectory.from_dict(d)


def test_generated_logprob_must_be_a_log_probability():
    d = two_turn_trajectory().to_dict()
    d["segments"][0]["logprobs"][3] = 0.5
    with pytest.raises(TrajectoryError, match=r"logprobs\[3\]"):
        Trajectory.from_dict(d)


def test_prompt_tokens_carry_no_logprob():
    d = two_turn_trajectory().to_dict()
    d["segments"][0]["logprobs"][0] = -1.0
    with pytest.raises(TrajectoryError, match="0.0 where the loss mask is 0"):
        Trajectory.from_dict(d)


def test_turns_must_be_ordered():
    d = two_turn_trajectory().to_dict()
    d["turns"].reverse()
    with pytest.raises(TrajectoryError, match="starts before the previous turn ends"):
        Trajectory.from_dict(d)


def test_unknown_stop_reason_is_named():
    with pytest.raises(TrajectoryError, match="stop_reason"):
        Trajectory(episode_id="e", task_id="t", stop_reason="bored")


def test_chat_only_trajectory_carries_no_tokens():
    Trajectory(episode_id="e", task_id="t", token_level=False, segments=[Segment()])
    with pytest.raises(TrajectoryError, match="chat-only"):
        Trajectory(episode_id="e", task_id="t", token_level=False, segments=[two_turn_trajectory().segments[0]])


def test_generated_tokens_need_logprobs():
    with pytest.raises(TrajectoryError, match="one sampling logprob each"):
        Segment().extend([1, 2], generated=True, logprobs=[-1.0])


def test_tool_call_is_plain_data():
    assert ToolCall("compile").arguments == {}
