"""The data that crosses between the environment, the agent and the learner, below all three.

    results.py      EvalResult: the environment's verdict on a solution (its milestone, timings, failure)
    trajectory.py   Trajectory: one episode token by token, as the agent produced it and the learner trains on it
    weights.py      the one wire format of the policy's weights on their way to the generators
    records.py      JSONL run records: appended a line at a time, read back whole after a crash

Plain dataclasses and plain torch; nothing here imports another package of the project.
"""
