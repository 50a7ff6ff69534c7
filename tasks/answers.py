"""The learning check's task family: write an asked word to a file.

Each task asks for one word of a pair (``Write the word "yes" to answer.txt.``); the verifier
(env_pool/answer_check.py) rewards the file whose content is that word, or, in the control
run, the other word of its pair. A model that writes either word of a pair at random earns
half the time, so a policy gradient has signal from its first step, and the word asked for is
in the prompt, so what it must learn (copy it, or in the control negate it) is a rule, not a
fact. The tasks are plain ``Task`` values, the question as their source, so they travel through
the generators and the buffer like kernel problems.
"""
from __future__ import annotations

import re

from tasks.task import Task

PAIRS = (("yes", "no"),)  # each word's opposite is the other word of its pair
QUESTION = 'Write the word "{word}" to {file}.'
_ASKED = re.compile(r'Write the word "([a-z]+)" to ')


def answer_tasks(answer_file: str = "answer.txt") -> list[Task]:
    """One task per word of every pair."""
    return [Task(id=f"answer/{word}", level=0, source=QUESTION.format(word=word, file=answer_file))
            for pair in PAIRS for word in pair]


def asked_word(task: Task) -> str:
    """The word a task asks for, read from its question."""
    found = _ASKED.match(task.source)
    if not found or opposite(found.group(1)) is None:
        raise ValueError(f"task {task.id!r} is not a learning-check question: {task.source[:80]!r}")
    return found.group(1)


def opposite(word: str) -> str | None:
    """The other word of ``word``'s pair; None for a word of no pair."""
    for a, b in PAIRS:
        if word in (a, b):
            return b if word == a else a
    return None
