"""The two ends of the TrajectoryBuffer that touch the object store: ``push`` and ``fetch``.

A generator pushes a trajectory: it goes into the object store and only its reference and
meta travel to the buffer (actors/buffer.py). The learner fetches a batch's trajectories from
the object store itself.

Lost trajectories: an object lives only as long as its owner, the generator that put it
(Ray 2.56 removed ``ray.put(_owner=...)``, the way to hand ownership to the buffer). If a
generator dies before the learner fetches its trajectories, ``fetch`` reports them as lost;
the buffer's ``forget`` un-accepts them so their reruns are accepted, and counted, once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray

from actors.trajectory_queue import Batch, TrajectoryMeta
from protocol.trajectory import Trajectory


def push(buffer: Any, trajectory: Trajectory, version: int | None = None) -> Any:
    """From a generator: store the trajectory, send its reference and meta; returns the put's ObjectRef.

    The answer (one of PUT_RESULTS) comes once the buffer has room: await or ray.get it to
    feel the backpressure.
    """
    meta = TrajectoryMeta.of(trajectory, version)
    return buffer.put.remote(meta.to_dict(), [ray.put(trajectory)])


@dataclass
class Fetched:
    trajectories: list[Trajectory]
    weights: list[float]  # the loss weight of each trajectory, aligned with them
    lost: list[TrajectoryMeta]  # died with their generator: ``forget`` them, then rerun their tasks


def fetch(batch: Batch, timeout_s: float | None = None) -> Fetched:
    """From the learner: the batch's trajectories out of the object store, and those that were lost."""
    from ray.exceptions import ObjectLostError

    try:
        values = ray.get(batch.refs, timeout=timeout_s)
        return Fetched(values, batch.weights, [])
    except ObjectLostError:
        pass  # one at a time, to keep the rest (OwnerDiedError is an ObjectLostError)
    fetched = Fetched([], [], [])
    for item in batch.items:
        try:
            fetched.trajectories.append(ray.get(item.ref, timeout=timeout_s))
            fetched.weights.append(item.weight)
        except ObjectLostError:
            fetched.lost.append(item.meta)
    return fetched
