"""TrajectoryQueue: the bounded, staleness-aware, exactly-once queue between generators and the learner.

Plain asyncio, no Ray (unit tests use it directly; the Ray actor TrajectoryBuffer in
actors/buffer.py holds one). It keeps each trajectory by reference (whatever the caller passes:
an object-store reference in the actor), with a few numbers alongside (TrajectoryMeta), so it
decides what to keep and what to serve without ever seeing a trajectory.

- Bounded: a put waits while the queue is full, so generators slow down to the learner's pace
  instead of piling up trajectories that would go stale anyway (backpressure).
- Staleness: a trajectory's staleness is the learner's current version minus the *newest*
  policy version among its turns (weights are swapped mid-episode). Beyond ``stage.max_staleness``
  it is dropped, or served with a smaller loss weight (``stage.stale_policy``). Its older turns
  are corrected token by token by the learner (decoupled PPO: the sampler's logprobs, the
  proximal policy, an importance weight capped at ``learner.importance_cap``), within a bound:
  an episode whose *oldest* turn is more than ``stage.max_turn_staleness`` versions behind is
  dropped whatever its newest. Judged by the oldest turn alone, every episode that spanned more
  than one learner step was dropped in asynchronous mode: short episodes kept, long ones lost.
  Judged again at serve time, since the learner moves on while trajectories wait.
- Exactly once: an episode_id is accepted once; a rerun of an episode already accepted (its
  generator died after pushing) is answered "duplicate" and not counted again.
- Lost trajectories: ``forget`` un-accepts episodes whose trajectories were lost before the
  learner fetched them (actors/buffer_client.py says how that happens), so their reruns are
  accepted, and counted, once.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from protocol.trajectory_meta import TrajectoryMeta

STALE_POLICIES = ("drop", "downweight")
PUT_RESULTS = ("accepted", "duplicate", "dropped_stale", "dropped_unjudged")  # what a put answers


class BufferClosed(RuntimeError):
    """The buffer was closed (the run is ending); no more trajectories are accepted."""


@dataclass
class BatchItem:
    meta: TrajectoryMeta
    ref: Any  # ray.ObjectRef of the Trajectory
    staleness: int  # learner version minus meta.version_max (its newest turn) when served
    weight: float = 1.0  # loss weight: below 1 only for downweighted stale trajectories


@dataclass
class Batch:
    items: list[BatchItem]
    version: int  # the learner version the batch was judged against

    def __len__(self) -> int:
        return len(self.items)

    @property
    def num_tokens(self) -> int:
        return sum(i.meta.num_tokens for i in self.items)

    @property
    def refs(self) -> list[Any]:
        return [i.ref for i in self.items]

    @property
    def weights(self) -> list[float]:
        return [i.weight for i in self.items]


@dataclass
class BufferStats:
    version: int = 0  # the learner's current policy version
    put: int = 0  # episodes accepted (each episode_id once)
    duplicates: int = 0  # puts of an episode_id already accepted (reruns), not counted
    dropped_stale: int = 0  # accepted, then dropped for staleness (on arrival or while waiting)
    dropped_unjudged: int = 0  # not kept: the environment failed to judge them (an infra error), so their reward is no signal
    lost: int = 0  # accepted, then forgotten because the trajectory died with its generator (rerun)
    downweighted: int = 0  # served stale with a weight below 1
    served: int = 0  # episodes handed to the learner
    served_tokens: int = 0
    batches: int = 0
    depth: int = 0  # trajectories waiting now
    queued_tokens: int = 0  # their tokens
    put_waits: int = 0  # puts that found the buffer full and waited
    put_wait_s: float = 0.0  # total time generators waited on a full buffer
    get_wait_s: float = 0.0  # total time the learner waited for a batch
    staleness: dict[int, int] = field(default_factory=dict)  # histogram of served episodes: staleness -> count

    @property
    def staleness_mean(self) -> float:
        n = sum(self.staleness.values())
        return sum(k * v for k, v in self.staleness.items()) / n if n else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "staleness_mean": self.staleness_mean}


def buffer_options(stage: Any) -> dict[str, Any]:
    """TrajectoryQueue / TrajectoryBuffer keyword arguments from ``cfg.stage``."""
    get = stage.get if hasattr(stage, "get") else lambda k: getattr(stage, k)
    policy = get("stale_policy")
    return {"capacity": get("buffer_capacity"), "max_staleness": get("max_staleness"),
            "max_turn_staleness": get("max_turn_staleness"),
            "stale_policy": str(policy), "stale_weight": get("stale_weight")}


@dataclass
class _Entry:
    meta: TrajectoryMeta
    ref: Any


class TrajectoryQueue:
    """The buffer's logic on one asyncio loop; every public coroutine is safe to call concurrently."""

    def __init__(self, capacity: int = 64, max_staleness: int = 1, stale_policy: str = "drop",
                 stale_weight: float = 0.5, version: int = 0, max_turn_staleness: int = 4):
        if capacity < 1:
            raise ValueError(f"stage.buffer_capacity must be at least 1, got {capacity}")
        if max_staleness < 0:
            raise ValueError(f"stage.max_staleness must be 0 or more, got {max_staleness}")
        if stale_policy not in STALE_POLICIES:
            raise ValueError(f"stage.stale_policy must be one of {', '.join(STALE_POLICIES)}, got {stale_policy!r}")
        if not 0.0 < stale_weight <= 1.0:
            raise ValueError(f"stage.stale_weight must be in (0, 1], got {stale_weight}")
        if max_turn_staleness < max_staleness:
            raise ValueError(f"stage.max_turn_staleness ({max_turn_staleness}) must be at least stage.max_staleness "
                             f"({max_staleness}): an episode's oldest turn is never newer than its newest")
        self.capacity = capacity
        self.max_staleness = max_staleness
        self.max_turn_staleness = max_turn_staleness
        self.stale_policy = stale_policy
        self.stale_weight = stale_weight
        self._items: deque[_Entry] = deque()
        self._accepted: set[str] = set()
        self._closed = False
        self._changed = asyncio.Condition()
        self._stats = BufferStats(version=version)

    # -- generators --------------------------------------------------------------------

    async def put(self, meta: TrajectoryMeta | Mapping[str, Any], ref: Any) -> str:
        """Accept a trajectory (waiting while full); answers one of PUT_RESULTS."""
        meta = meta if isinstance(meta, TrajectoryMeta) else TrajectoryMeta.from_dict(meta)
        if self._closed:
            raise BufferClosed(f"the buffer is closed; episode {meta.episode_id} was not accepted")
        if meta.episode_id in self._accepted:
            self._stats.duplicates += 1
            return "duplicate"
        # Claimed before waiting, so a rerun that arrives while the first put waits is a duplicate too.
        self._accepted.add(meta.episode_id)
        if not meta.judged:  # a reward of -1 for the environment's own failure would punish the policy for it
            self._stats.put += 1
            self._stats.dropped_unjudged += 1
            return "dropped_unjudged"
        try:
            async with self._changed:
                if len(self._items) >= self.capacity:
                    self._stats.put_waits += 1
                    started = time.monotonic()
                    await self._changed.wait_for(lambda: len(self._items) < self.capacity or self._closed)
                    self._stats.put_wait_s += time.monotonic() - started
                if self._closed:
                    raise BufferClosed(f"the buffer closed while episode {meta.episode_id} waited for room")
                self._stats.put += 1
                if self._too_stale(meta) and self.stale_policy == "drop":
                    self._stats.dropped_stale += 1
                    return "dropped_stale"
                self._items.append(_Entry(meta, ref))
                self._stats.queued_tokens += meta.num_tokens
                self._changed.notify_all()
                return "accepted"
        except BaseException:
            self._accepted.discard(meta.episode_id)
            raise

    # -- the learner -------------------------------------------------------------------

    async def set_version(self, version: int) -> None:
        """The learner's new policy version; with the drop policy, trajectories now too old go."""
        if version < self._stats.version:
            raise ValueError(f"policy version must not go backwards: {self._stats.version} -> {version}")
        async with self._changed:
            self._stats.version = version
            if self._purge_stale():
                self._changed.notify_all()  # room for waiting generators

    async def get_batch(self, max_episodes: int | None = None, max_tokens: int | None = None,
                        timeout_s: float | None = None) -> Batch:
        """The next batch, oldest first, by episode count and/or token budget.

        Waits until the batch is full (``max_episodes`` waiting, or ``max_tokens`` queued), the
        buffer itself is full (it cannot grow further), it is closed, or ``timeout_s`` passes;
        then serves what fits. One trajectory larger than the token budget is served alone.
        """
        if max_episodes is None and max_tokens is None:
            raise ValueError("get_batch needs max_episodes, max_tokens, or both")
        if (max_episodes is not None and max_episodes < 1) or (max_tokens is not None and max_tokens < 1):
            raise ValueError(f"max_episodes and max_tokens must be positive, got {max_episodes}, {max_tokens}")
        started = time.monotonic()
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self._batch_ready(max_episodes, max_tokens)), timeout_s)
            except asyncio.TimeoutError:
                self._purge_stale()
            batch = self._take(max_episodes, max_tokens)
            self._changed.notify_all()
        self._stats.get_wait_s += time.monotonic() - started
        return batch

    async def forget(self, episode_ids: list[str]) -> int:
        """Un-accept episodes whose trajectories were lost, so their reruns are accepted; returns how many."""
        ids = set(episode_ids) & self._accepted
        async with self._changed:
            self._accepted -= ids
            self._stats.lost += len(ids)
            waiting = [e for e in self._items if e.meta.episode_id in ids]
            if waiting:
                self._items = deque(e for e in self._items if e.meta.episode_id not in ids)
                self._stats.queued_tokens -= sum(e.meta.num_tokens for e in waiting)
                self._changed.notify_all()
        return len(ids)

    def stats(self) -> BufferStats:
        self._stats.depth = len(self._items)
        return self._stats

    async def close(self) -> None:
        """Refuse further puts and wake every waiter (waiting puts fail, waiting gets return what there is)."""
        async with self._changed:
            self._closed = True
            self._changed.notify_all()

    # -- internals ---------------------------------------------------------------------

    def _staleness(self, meta: TrajectoryMeta) -> int:
        return max(0, self._stats.version - meta.version_max)

    def _too_stale(self, meta: TrajectoryMeta) -> bool:
        oldest = self._stats.version - meta.version_min
        return self._staleness(meta) > self.max_staleness or oldest > self.max_turn_staleness

    def _purge_stale(self) -> int:
        if self.stale_policy != "drop":
            return 0
        keep = deque(e for e in self._items if not self._too_stale(e.meta))
        dropped = len(self._items) - len(keep)
        if dropped:
            self._stats.dropped_stale += dropped
            self._stats.queued_tokens = sum(e.meta.num_tokens for e in keep)
            self._items = keep
        return dropped

    def _batch_ready(self, max_episodes: int | None, max_tokens: int | None) -> bool:
        if self._purge_stale():
            self._changed.notify_all()  # room for waiting generators (the caller holds the lock)
        n = len(self._items)
        return (self._closed or n >= self.capacity or (max_episodes is not None and n >= max_episodes)
                or (max_tokens is not None and n > 0 and self._stats.queued_tokens >= max_tokens))

    def _take(self, max_episodes: int | None, max_tokens: int | None) -> Batch:
        items: list[BatchItem] = []
        tokens = 0
        while self._items and (max_episodes is None or len(items) < max_episodes):
            entry = self._items[0]
            if max_tokens is not None and items and tokens + entry.meta.num_tokens > max_tokens:
                break
            self._items.popleft()
            tokens += entry.meta.num_tokens
            items.append(self._serve(entry))
        self._stats.queued_tokens -= tokens
        self._stats.batches += bool(items)
        return Batch(items, self._stats.version)

    def _serve(self, entry: _Entry) -> BatchItem:
        staleness = self._staleness(entry.meta)
        beyond = staleness - self.max_staleness
        weight = self.stale_weight ** beyond if beyond > 0 else 1.0
        self._stats.downweighted += beyond > 0
        self._stats.served += 1
        self._stats.served_tokens += entry.meta.num_tokens
        self._stats.staleness[staleness] = self._stats.staleness.get(staleness, 0) + 1
        return BatchItem(entry.meta, entry.ref, staleness, weight)
