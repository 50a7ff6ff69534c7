"""TrajectoryBuffer: backpressure, staleness (drop and downweight), exactly-once, batching.

The plain TrajectoryQueue is driven with asyncio directly; the Ray actor is checked on a real
local cluster, with trajectories pushed through the object store by another actor.
"""
from __future__ import annotations

import asyncio
import time

import pytest

from actors.buffer import TrajectoryBuffer
from actors.buffer_client import fetch, push
from actors.trajectory_queue import BufferClosed, TrajectoryQueue, buffer_options
from protocol.trajectory_meta import TrajectoryMeta
from configs.load import load_config
from protocol.trajectory import Segment, Trajectory, Turn


def trajectory(episode_id: str, versions=(0,), generated: int = 4, prompt: int = 4, reward: float = 1.0,
               milestone: int = 1) -> Trajectory:
    """A prompt, then per version one generated turn followed by two tokens of tool output."""
    seg = Segment()
    seg.extend(list(range(prompt)), generated=False)
    turns = []
    for v in versions:
        start = len(seg)
        seg.extend([5] * generated, generated=True, logprobs=[-0.5] * generated)
        turns.append(Turn(segment=0, start=start, end=len(seg), version=v))
        seg.extend([7, 7], generated=False)
    return Trajectory(episode_id, "level1/01_gelu", [seg], turns, reward=reward, milestone=milestone)


def meta(episode_id: str, versions=(0,), tokens: int | None = None) -> TrajectoryMeta:
    m = TrajectoryMeta.of(trajectory(episode_id, versions))
    if tokens is not None:
        m.num_tokens = tokens
    return m


def run(coro):
    return asyncio.run(coro)


# --------------------------------------------------------------------------- the plain queue


def test_meta_carries_the_version_range_tokens_and_reward_and_round_trips():
    m = TrajectoryMeta.of(trajectory("e1", versions=(3, 4, 4), reward=2.0, milestone=2))
    assert (m.version_min, m.version_max, m.num_tokens, m.num_generated, m.reward, m.milestone) == (3, 4, 4 + 3 * 6, 12, 2.0, 2)
    assert TrajectoryMeta.from_dict(m.to_dict()) == m
    with pytest.raises(ValueError, match="has no turns, so no policy version: pass version="):
        TrajectoryMeta.of(Trajectory("e2", "t", stop_reason="error"))
    assert TrajectoryMeta.of(Trajectory("e2", "t", stop_reason="error"), version=7).version_min == 7


def test_a_put_on_a_full_buffer_waits_until_the_learner_takes_a_batch():
    async def scenario():
        q = TrajectoryQueue(capacity=2)
        assert await q.put(meta("a"), "ref-a") == "accepted"
        assert await q.put(meta("b"), "ref-b") == "accepted"
        third = asyncio.create_task(q.put(meta("c"), "ref-c"))
        await asyncio.sleep(0.1)
        assert not third.done(), "a put on a full buffer must wait"
        batch = await q.get_batch(max_episodes=1)
        assert batch.refs == ["ref-a"]
        assert await asyncio.wait_for(third, 1.0) == "accepted"
        stats = q.stats()
        assert (stats.put, stats.depth, stats.put_waits) == (3, 2, 1) and stats.put_wait_s >= 0.1
    run(scenario())


def test_get_batch_waits_for_enough_episodes_and_returns_what_there_is_on_timeout():
    async def scenario():
        q = TrajectoryQueue(capacity=8)
        getter = asyncio.create_task(q.get_batch(max_episodes=2))
        await q.put(meta("a"), "a")
        await asyncio.sleep(0.05)
        assert not getter.done(), "one episode is not a batch of two"
        await q.put(meta("b"), "b")
        assert (await asyncio.wait_for(getter, 1.0)).refs == ["a", "b"]
        await q.put(meta("c"), "c")
        partial = await q.get_batch(max_episodes=4, timeout_s=0.05)
        assert partial.refs == ["c"]
        assert len(await q.get_batch(max_episodes=4, timeout_s=0.01)) == 0
    run(scenario())


def test_a_learner_waiting_on_a_buffer_too_small_for_its_batch_is_served_when_the_buffer_fills():
    async def scenario():
        q = TrajectoryQueue(capacity=2)
        getter = asyncio.create_task(q.get_batch(max_episodes=5))
        await q.put(meta("a"), "a")
        await q.put(meta("b"), "b")  # full: generators would block, so waiting longer would deadlock
        assert (await asyncio.wait_for(getter, 1.0)).refs == ["a", "b"]
    run(scenario())


def test_stale_trajectories_are_dropped_on_arrival_and_while_waiting_under_the_drop_policy():
    async def scenario():
        q = TrajectoryQueue(capacity=8, max_staleness=1, stale_policy="drop", max_turn_staleness=2)
        for name, versions in [("v0", (0,)), ("v1", (1,)), ("v2", (2,)), ("mixed", (0, 2))]:
            assert await q.put(meta(name, versions), name) == "accepted"
        await q.set_version(2)  # v0 is now 2 versions old; "mixed" began under 0 but its newest turn is 2's
        assert q.stats().depth == 3 and q.stats().dropped_stale == 1
        assert await q.put(meta("late", (0,)), "late") == "dropped_stale"
        batch = await q.get_batch(max_episodes=8, timeout_s=0)
        assert batch.refs == ["v1", "v2", "mixed"] and batch.version == 2
        assert [(i.staleness, i.weight) for i in batch.items] == [(1, 1.0), (0, 1.0), (0, 1.0)]
        stats = q.stats()
        assert (stats.put, stats.dropped_stale, stats.served) == (5, 2, 3)
        assert stats.staleness == {1: 1, 0: 2}
        with pytest.raises(ValueError, match="must not go backwards: 2 -> 1"):
            await q.set_version(1)
    run(scenario())


def test_a_long_episode_spanning_several_learner_steps_is_kept_within_the_turn_bound():
    """Judged by its oldest turn, every episode that outlived one learner step was dropped in
    asynchronous mode: the short ones trained on, the long ones lost. Its newest turn decides now,
    its older turns are the learner's to correct (capped importance weights), up to a bound."""
    async def scenario():
        q = TrajectoryQueue(capacity=8, max_staleness=1, stale_policy="drop", max_turn_staleness=3)
        spans = {"short": (3,), "long": (0, 1, 2, 3), "too_long": (0, 1, 2, 3)}
        for name, versions in spans.items():
            assert await q.put(meta(name, versions), name) == "accepted"
        await q.set_version(3)
        batch = await q.get_batch(max_episodes=8, timeout_s=0)
        assert batch.refs == ["short", "long", "too_long"]  # the oldest turns 3 versions back: within the bound
        for name, versions in {"older": (0, 4), "fresh": (4,)}.items():
            assert await q.put(meta(name, versions), name) == "accepted"
        await q.set_version(4)
        batch = await q.get_batch(max_episodes=8, timeout_s=0)
        assert batch.refs == ["fresh"] and q.stats().dropped_stale == 1  # 4 versions back: beyond the bound
        with pytest.raises(ValueError, match="max_turn_staleness"):
            TrajectoryQueue(max_staleness=3, max_turn_staleness=2)
    run(scenario())


def test_trajectories_the_environment_failed_to_judge_are_never_trained_on():
    infra = trajectory("infra", reward=-1.0, milestone=0)
    infra.final_eval = {"failure": "infra", "message": "the baselines measured implausibly"}
    errored = trajectory("errored", reward=-1.0, milestone=0)
    errored.stop_reason, errored.error = "error", "the env worker died"
    wrong = trajectory("wrong", reward=-1.0, milestone=0)
    wrong.final_eval = {"failure": "wrong", "message": "wrong on round 0"}
    assert (infra.judged, errored.judged, wrong.judged) == (False, False, True)

    async def scenario():
        q = TrajectoryQueue(capacity=1, max_staleness=4, stale_policy="drop")
        answers = [await q.put(TrajectoryMeta.of(t), t.episode_id) for t in (infra, errored, wrong)]
        assert answers == ["dropped_unjudged", "dropped_unjudged", "accepted"], "the unjudged must not even wait for room"
        batch = await q.get_batch(max_episodes=8, timeout_s=0)
        assert batch.refs == ["wrong"] and q.stats().dropped_unjudged == 2
    run(scenario())


def test_stale_trajectories_are_served_with_geometrically_smaller_weights_under_downweight():
    async def scenario():
        q = TrajectoryQueue(capacity=8, max_staleness=0, stale_policy="downweight", stale_weight=0.5, version=3)
        for name, v in [("fresh", 3), ("one", 2), ("three", 0)]:
            assert await q.put(meta(name, (v,)), name) == "accepted"
        batch = await q.get_batch(max_episodes=3)
        assert [(i.meta.episode_id, i.staleness, i.weight) for i in batch.items] == [
            ("fresh", 0, 1.0), ("one", 1, 0.5), ("three", 3, 0.125)]
        stats = q.stats()
        assert (stats.dropped_stale, stats.downweighted, stats.staleness) == (0, 2, {0: 1, 1: 1, 3: 1})
    run(scenario())


def test_a_rerun_of_an_accepted_episode_is_not_counted_twice_even_while_the_first_put_waits():
    async def scenario():
        q = TrajectoryQueue(capacity=1)
        assert await q.put(meta("a"), "a") == "accepted"
        assert await q.put(meta("a"), "a-rerun") == "duplicate"
        waiting = asyncio.create_task(q.put(meta("b"), "b"))
        await asyncio.sleep(0.05)
        assert await q.put(meta("b"), "b-rerun") == "duplicate"
        # A put that never got in (cancelled while waiting) did not accept its episode: the rerun may.
        cancelled = asyncio.create_task(q.put(meta("c"), "c"))
        await asyncio.sleep(0.05)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        first = await q.get_batch(max_episodes=1)
        await asyncio.wait_for(waiting, 1.0)
        second = await q.get_batch(max_episodes=1)
        assert await q.put(meta("c"), "c-rerun") == "accepted"
        third = await q.get_batch(max_episodes=1)
        assert first.refs + second.refs + third.refs == ["a", "b", "c-rerun"]
        stats = q.stats()
        assert (stats.put, stats.duplicates, stats.served) == (3, 2, 3)
    run(scenario())


def test_batches_by_token_budget_take_the_oldest_that_fit_and_an_oversized_one_alone():
    async def scenario():
        q = TrajectoryQueue(capacity=8)
        for name, tokens in [("a", 10), ("b", 10), ("c", 10), ("big", 40), ("d", 5)]:
            await q.put(meta(name, tokens=tokens), name)
        assert q.stats().queued_tokens == 75
        first = await q.get_batch(max_tokens=25)
        assert first.refs == ["a", "b"] and first.num_tokens == 20
        assert (await q.get_batch(max_tokens=25)).refs == ["c"]  # "big" does not fit beside it
        assert (await q.get_batch(max_tokens=25)).refs == ["big"]  # alone: it never fits a budget of 25
        assert (await q.get_batch(max_tokens=25, timeout_s=0.05)).refs == ["d"]  # 5 < 25 tokens: waited, then served
        assert (await q.get_batch(max_tokens=100, max_episodes=1, timeout_s=0)).refs == []
        assert q.stats().queued_tokens == 0 and q.stats().served_tokens == 75
    run(scenario())


def test_closing_fails_waiting_puts_and_releases_waiting_gets():
    async def scenario():
        q = TrajectoryQueue(capacity=1)
        await q.put(meta("a"), "a")
        put = asyncio.create_task(q.put(meta("b"), "b"))
        await asyncio.sleep(0.05)
        await q.close()
        with pytest.raises(BufferClosed, match="closed while episode b waited"):
            await put
        assert (await q.get_batch(max_episodes=4)).refs == ["a"]
        assert len(await q.get_batch(max_episodes=4)) == 0
        with pytest.raises(BufferClosed, match="episode c was not accepted"):
            await q.put(meta("c"), "c")
    run(scenario())


def test_forgetting_a_lost_episode_frees_its_slot_and_lets_its_rerun_in():
    async def scenario():
        q = TrajectoryQueue(capacity=2)
        await q.put(meta("a", tokens=10), "a")
        await q.put(meta("b", tokens=20), "b")
        waiting = asyncio.create_task(q.put(meta("c", tokens=5), "c"))
        await asyncio.sleep(0.05)
        assert await q.forget(["a", "never-seen"]) == 1
        assert await asyncio.wait_for(waiting, 1.0) == "accepted"
        assert q.stats().queued_tokens == 25
        assert (await q.get_batch(max_episodes=1)).refs == ["b"]
        assert await asyncio.wait_for(q.put(meta("a", tokens=10), "a-rerun"), 1.0) == "accepted"
        assert (await q.get_batch(max_episodes=3, timeout_s=0)).refs == ["c", "a-rerun"]
        stats = q.stats()
        assert (stats.put, stats.lost, stats.duplicates) == (4, 1, 0)
    run(scenario())


@pytest.mark.parametrize("kwargs, message", [
    ({"capacity": 0}, "stage.buffer_capacity must be at least 1"),
    ({"max_staleness": -1}, "stage.max_staleness must be 0 or more"),
    ({"stale_policy": "keep"}, "stage.stale_policy must be one of drop, downweight"),
    ({"stale_weight": 0.0}, "stage.stale_weight must be in (0, 1]"),
])
def test_bad_settings_are_refused_naming_the_config_key(kwargs, message):
    with pytest.raises(ValueError) as err:
        TrajectoryQueue(**kwargs)
    assert message in str(err.value)


def test_options_come_from_the_stage_config():
    cfg = load_config([], ["stage.buffer_capacity=3", "stage.stale_policy=downweight", "stage.stale_weight=0.25",
                           "stage.max_turn_staleness=6"])
    assert buffer_options(cfg.stage) == {"capacity": 3, "max_staleness": 1, "max_turn_staleness": 6,
                                         "stale_policy": "downweight", "stale_weight": 0.25}


# --------------------------------------------------------------------------- the Ray actor


@pytest.fixture(scope="module")
def ray_cluster():
    import os

    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    assert not ray.is_initialized(), "an earlier test left Ray running"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             object_store_memory=100 * 1024**2)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def generator_class(ray_cluster):
    import ray

    @ray.remote(num_cpus=0)
    class Generator:  # refers only to importable modules: the workers cannot import this test file
        def run(self, buffer, episodes: list[dict]) -> list[str]:
            # One at a time: an async actor runs concurrent calls in no guaranteed order.
            return [ray.get(push(buffer, Trajectory.from_dict(e))) for e in episodes]

    return Generator


def test_trajectories_travel_by_reference_from_a_generator_to_the_learner(generator_class):
    import ray

    buffer = TrajectoryBuffer.remote(capacity=8)
    generator = generator_class.remote()
    episodes = [trajectory(e, versions=(0, 1)).to_dict() for e in ("e1", "e2", "e1")]
    assert ray.get(generator.run.remote(buffer, episodes), timeout=60) == ["accepted", "accepted", "duplicate"]
    ray.get(buffer.set_version.remote(1))
    batch = ray.get(buffer.get_batch.remote(max_episodes=2), timeout=60)
    assert all(isinstance(r, ray.ObjectRef) for r in batch.refs)
    fetched = fetch(batch.refs, timeout_s=60)
    assert fetched.trajectories == [trajectory("e1", versions=(0, 1)), trajectory("e2", versions=(0, 1))]
    assert batch.weights == [1.0, 1.0] and fetched.lost == []
    stats = ray.get(buffer.stats.remote())
    assert (stats["put"], stats["duplicates"], stats["served"], stats["staleness"]) == (2, 1, 2, {0: 2})  # by the newest turn
    ray.kill(generator)


def test_trajectories_lost_with_their_generator_are_reported_forgotten_and_rerun_once(generator_class):
    import ray

    buffer = TrajectoryBuffer.remote(capacity=8)
    doomed = generator_class.remote()
    episodes = [trajectory(e).to_dict() for e in ("e1", "e2")]
    assert ray.get(doomed.run.remote(buffer, episodes), timeout=60) == ["accepted", "accepted"]
    ray.kill(doomed)  # its objects die with it: the buffer holds references, not copies
    batch = ray.get(buffer.get_batch.remote(max_episodes=2), timeout=60)
    deadline = time.monotonic() + 30
    fetched = fetch(batch.refs, timeout_s=60)
    while fetched.trajectories and time.monotonic() < deadline:  # the store frees them a second or two after the kill
        time.sleep(0.2)
        fetched = fetch(batch.refs, timeout_s=60)
    lost = [batch.items[p].meta.episode_id for p in fetched.lost]
    assert fetched.trajectories == [] and lost == ["e1", "e2"]
    assert ray.get(buffer.forget.remote(lost)) == 2
    rerun = generator_class.remote()
    assert ray.get(rerun.run.remote(buffer, episodes + episodes[:1]), timeout=60) == ["accepted", "accepted", "duplicate"]
    fetched = fetch(ray.get(buffer.get_batch.remote(max_episodes=2), timeout=60).refs, timeout_s=60)
    assert [t.episode_id for t in fetched.trajectories] == ["e1", "e2"] and fetched.lost == []
    stats = ray.get(buffer.stats.remote())
    assert (stats["put"] - stats["lost"], stats["lost"], stats["duplicates"]) == (2, 2, 1)
    ray.kill(rerun)


def test_the_actor_applies_backpressure_to_a_pusher_until_a_batch_is_taken(ray_cluster):
    import ray

    buffer = TrajectoryBuffer.remote(capacity=1)
    first = push(buffer, trajectory("a"))
    assert ray.get(first, timeout=60) == "accepted"
    second = push(buffer, trajectory("b"))
    ready, _ = ray.wait([second], timeout=1.0)
    assert not ready, "the second push must wait while the buffer is full"
    assert ray.get(buffer.get_batch.remote(max_episodes=1), timeout=60).items[0].meta.episode_id == "a"
    assert ray.get(second, timeout=60) == "accepted"
    assert ray.get(buffer.stats.remote())["put_waits"] == 1
