"""The learning check's environment (env.kind=verifier): its tasks, its verdicts, and an episode
through the same tools and tool-call parser as the kernel tasks."""
from __future__ import annotations

import asyncio

import pytest

from env_pool.answer_check import check_answer
from rollout.episode import EpisodeSettings, run_episode
from rollout.policy import Generation
from rollout.toolbox import ToolBox
from rollout.workspace import Workspace
from tasks.answers import answer_tasks, asked_word, opposite


def test_each_task_asks_for_one_word_of_a_pair():
    tasks = answer_tasks()
    assert [asked_word(t) for t in tasks] == ["yes", "no"]
    assert opposite("yes") == "no" and opposite("no") == "yes" and opposite("maybe") is None


def test_the_asked_word_earns_the_reward_and_the_control_rewards_the_other():
    yes = answer_tasks()[0]
    right = check_answer(yes, {"answer.txt": " Yes\n"}, "answer.txt", False, 1.0, -1.0)
    wrong = check_answer(yes, {"answer.txt": "no"}, "answer.txt", False, 1.0, -1.0)
    control = check_answer(yes, {"answer.txt": "no"}, "answer.txt", True, 1.0, -1.0)
    missing = check_answer(yes, {}, "answer.txt", False, 1.0, -1.0)
    assert (right.reward, right.milestone) == (1.0, 1)
    assert (wrong.reward, wrong.failure) == (-1.0, "wrong")
    assert control.reward == 1.0, "the control run rewards the opposite word"
    assert (missing.reward, missing.failure) == (-1.0, "missing_files")


class LocalAnswers:
    """The verifier in this process (the AnswerWorker's evaluate, without Ray)."""

    def __init__(self):
        self.seen = []

    async def evaluate(self, task, files, mode):
        self.seen.append(dict(files))
        return check_answer(task, files, "answer.txt", False, 1.0, -1.0)


class Scripted:
    """A text-level policy that writes one fixed turn."""

    token_level, tokenizer, version = False, None, 0

    def __init__(self, text):
        self.text = text

    async def generate(self, request):
        self.request = request
        return Generation(text=self.text, token_ids=[], logprobs=[], finish_reason="stop", version=0)


def run(tmp_path, text):
    task = answer_tasks()[0]
    env, policy = LocalAnswers(), Scripted(text)
    ws = Workspace.create(tmp_path, "e1", task, "cpp", "")
    tools = ToolBox(task, ws, env, "cpp", answer_file="answer.txt")
    traj = asyncio.run(run_episode(task, policy, tools, EpisodeSettings(max_turns=1), "", "cpp", "e1"))
    return traj, env, policy


def test_an_answer_written_through_the_hermes_tool_call_is_judged_on_its_file(tmp_path):
    call = '<tool_call>\n{"name": "write_file", "arguments": {"path": "answer.txt", "content": "yes"}}\n</tool_call>'
    traj, env, policy = run(tmp_path, call)
    assert traj.reward == 1.0 and traj.turns[0].calls == 1 and traj.turns[0].invalid_calls == 0
    assert env.seen == [{"answer.txt": "yes"}], "the verifier sees the answer file only"
    assert policy.request.messages[1]["content"] == 'Write the word "yes" to answer.txt.'
    assert [s["function"]["name"] for s in policy.request.tools] == ["write_file", "submit"]


def test_a_turn_without_a_call_leaves_no_answer_and_fails(tmp_path):
    traj, env, _ = run(tmp_path, "yes")
    assert traj.reward == -1.0 and traj.final_eval["failure"] == "missing_files"


def test_the_expected_reward_follows_the_asked_word_preference_and_flips_for_the_control():
    import math

    from launch.primed_model import expected_reward, preference_change

    # P(asked) = sigmoid(p): an even preference earns 0, a preference of log 3 (3 to 1) earns 0.5.
    assert expected_reward({"answer/yes": 0.0, "answer/no": 0.0}) == 0.0
    assert expected_reward({"answer/yes": math.log(3), "answer/no": math.log(3)}) == pytest.approx(0.5)
    assert expected_reward({"answer/yes": math.log(3), "answer/no": -math.log(3)}) == pytest.approx(0.0)
    assert expected_reward({"answer/yes": math.log(3)}, inverted=True) == pytest.approx(-0.5)
    line = preference_change({"answer/yes": 1.0}, {"answer/yes": 3.0})
    assert line == "asked-word preference (nats): answer/yes +1.00 -> +3.00; expected reward +0.46 -> +0.91"
