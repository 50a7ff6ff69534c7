"""The two ends of the TrajectoryBuffer that touch the object store: ``push`` and ``fetch``.

A generator pushes a trajectory: it goes into the object store and only its reference and
meta travel to the buffer (actors/buffer.py). Only the learner's ranks fetch a batch's
trajectories from the object store (LearnerGroup.step); everything above them reads the meta.

Lost trajectories: an object lives only as long as its owner, the generator that put it
(Ray 2.56 removed ``ray.put(_owner=...)``, the way to hand ownership to the buffer). If a
generator dies before the learner fetches its trajectories, ``fetch`` reports them as lost, the
learner trains on the rest, and the driver has the buffer ``forget`` them, so that their reruns
are accepted, and counted, once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray

from protocol.trajectory import Trajectory
from protocol.trajectory_meta import TrajectoryMeta


def push(buffer: Any, trajectory: Trajectory, version: int | None = None) -> Any:
    """From a generator: store the trajectory, send its reference and meta; returns the put's ObjectRef.

    The answer (one of PUT_RESULTS) comes once the buffer has room: await or ray.get it to
    feel the backpressure.
    """
    meta = TrajectoryMeta.of(trajectory, version)
    return buffer.put.remote(meta.to_dict(), [ray.put(trajectory)])


@dataclass
class Fetched:
    trajectories: list[Trajectory]  # those that were there, in the order asked
    lost: list[int]  # positions (in the refs asked for) of those that died with their generator


def fetch(refs: list[Any], timeout_s: float | None = None) -> Fetched:
    """From a learner rank: trajectories out of the object store, and the positions of those lost
    (the driver ``forget``s them and reruns their tasks)."""
    from ray.exceptions import ObjectLostError

    try:
        return Fetched(ray.get(refs, timeout=timeout_s), [])
    except ObjectLostError:
        pass  # one at a time, to keep the rest (OwnerDiedError is an ObjectLostError)
    fetched = Fetched([], [])
    for position, ref in enumerate(refs):
        try:
            fetched.trajectories.append(ray.get(ref, timeout=timeout_s))
        except ObjectLostError:
            fetched.lost.append(position)
    return fetched
