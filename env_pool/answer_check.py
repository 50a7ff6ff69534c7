"""The learning check's environment (env.kind=verifier): is the answer file the expected word?

The second environment kind, beside the kernel environment: a task asks for a word
(tasks/answers.py), the agent writes a file through the same tools and tool-call parser as
for kernels, and this verifier reads that file and gives the milestone CORRECT (reward
env.reward.correct) when its content is the expected word, FAIL (env.reward.failure)
otherwise. With env.verifier.inverted the expected word is the other one of its pair: the
control run, in which a correct learner must move the policy the opposite way.

``AnswerWorker`` is its Ray actor, with the EnvWorker's interface (evaluate, profile_reference,
ncu, health), so generators reach it through the same RayEnvClient.
"""
from __future__ import annotations

import time
from typing import Any, Mapping

import ray

from protocol.results import EvalResult, Milestone
from tasks.answers import asked_word, opposite
from tasks.task import Task


def expected_answer(task: Task, inverted: bool) -> str:
    word = asked_word(task)
    return opposite(word) if inverted else word


def check_answer(task: Task, files: Mapping[str, str], answer_file: str, inverted: bool,
                 correct_reward: float, failure_reward: float) -> EvalResult:
    """The verdict on what the agent wrote to ``answer_file`` (surrounding whitespace and case ignored)."""
    expected = expected_answer(task, inverted)
    written = files.get(answer_file)
    if written is None:
        result = EvalResult(task_id=task.id, backend="verifier", failure="missing_files",
                            message=f"{answer_file} is missing: write the answer to it")
    elif written.strip().lower() != expected:
        result = EvalResult(task_id=task.id, backend="verifier", failure="wrong",
                            message=f"{answer_file} holds {written.strip()[:40]!r}: wrong answer")
    else:
        result = EvalResult(task_id=task.id, backend="verifier", milestone=Milestone.CORRECT,
                            message=f"{answer_file}: correct")
    result.reward = correct_reward if result.milestone == Milestone.CORRECT else failure_reward
    return result


@ray.remote
class AnswerWorker:
    """The verifier as an env worker (EnvWorker's interface): a Task in, an EvalResult back."""

    def __init__(self, cfg: Mapping[str, Any], cpu_share: tuple[int, int] = (0, 1)):
        verifier, reward = cfg["verifier"], cfg["reward"]
        self.answer_file, self.inverted = verifier["answer_file"], bool(verifier["inverted"])
        self.correct, self.failure = float(reward["correct"]), float(reward["failure"])
        self.stats = {"pending": 0, "busy_s": 0.0, "evaluated": 0}

    def evaluate(self, task: Task, files: Mapping[str, str], mode: str = "full") -> EvalResult:
        started = time.perf_counter()
        result = check_answer(task, files, self.answer_file, self.inverted, self.correct, self.failure)
        self.stats["evaluated"] += 1
        self.stats["busy_s"] += time.perf_counter() - started
        return result

    def profile_reference(self, task: Task) -> dict[str, Any]:
        return {"ok": False, "error": "the learning check has no reference to profile"}

    def ncu(self, task: Task, files: Mapping[str, str]) -> str:
        return "ncu is unavailable in the learning check"

    def health(self) -> dict[str, Any]:
        return {"healthy": True, "stats": dict(self.stats)}
