"""The data plane of a learner step: episodes from the buffer to the learner, and the step's metrics.

    synchronous mode: a round of stage.batch_episodes episodes (generate), then the step on
                      exactly those the buffer accepted
    asynchronous mode: the feeder keeps generating; each step draws a batch from the buffer
    a step: draw a batch (references and metas) -> whole groups (stage.group_size, dynamic
            sampling) -> RFT's filter (learner.rft) -> GRPO's advantages -> the learner group's
            train_step (its ranks fetch the tokens; lost ones are rerun) -> the step's metrics
            (protocol/step_record.py) and its episodes' audit lines
    The driver never fetches a trajectory: every number it decides on is in its TrajectoryMeta.

The driver (launch/train.py) calls ``synchronous_step`` or ``learner_step`` once per step and
writes what they return; a ``display`` (launch/progress.ProgressDisplay) is shown each phase.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from actors.feeder import JobFeeder
from actors.grouping import GroupAssembler
from actors.system import System
from actors.trajectory_queue import BatchItem
from learner.groups import group_advantages
from learner.rft import filter_episodes
from protocol.step_record import SKIPPED, episode_metrics
from protocol.trajectory_meta import TrajectoryMeta


def phase(display: Any, what: str, detail: Any = None) -> Any:
    """The display's live phase (launch/progress.ProgressDisplay.watched_phase), or nothing without one."""
    return display.watched_phase(what, detail) if display is not None else contextlib.nullcontext()


def skip_reason(kind: str, offered: int, left: int, ranks: int) -> str:
    """Why a step trained nothing, in the terms of the setting that decided it."""
    need = f"{ranks} needed (one per learner rank)"
    if kind == "rft":
        return f"{left} of {offered} episodes passed RFT's filter (learner.rft), {need}"
    return f"{left} of {offered} episodes left after dynamic sampling (stage.dynamic_sampling), {need}"


async def generate(display: Any, system: System, feeder: JobFeeder, episodes: int) -> list[Any]:
    """``episodes`` episodes on the generators (the synchronous mode), the display following them;
    the buffer's answer for each."""
    async with phase(display, f"generating {episodes} episodes", episodes_detail(system, episodes)):
        return await feeder.run_count(episodes)


def episodes_detail(system: System, wanted: int) -> Any:
    """What the generators' episodes are doing, counted from the first time it is asked (a phase's start)."""
    first: dict[str, int] = {}

    async def detail() -> str:
        stats = await asyncio.gather(*(g.get_stats.remote() for g in system.generators), return_exceptions=True)
        now: dict[str, int] = {}
        for s in stats:
            for key, value in (s.get("activity", {}) if isinstance(s, dict) else {}).items():
                now[key] = now.get(key, 0) + value
        first.update({k: v for k, v in now.items() if k not in first})
        done = max(0, now.get("finished", 0) - first.get("finished", 0))
        running = now.get("started", 0) - now.get("finished", 0)
        turns = max(0, now.get("turns", 0) - first.get("turns", 0))
        return (f"{min(done, wanted)} of {wanted} done, {running} in flight ({now.get('generating', 0)} generating, "
                f"{now.get('in_env', 0)} in the environment), {turns} turn(s) so far")

    return detail


async def actor_load(system: System, wall: float) -> dict[str, float]:
    """How busy the generators and env workers were: queue depths and busy time (idle is the rest)."""
    gens = await asyncio.gather(*(g.get_stats.remote() for g in system.generators), return_exceptions=True)
    envs = await asyncio.gather(*(w.health.remote() for w in system.env_workers), return_exceptions=True)
    gens = [g for g in gens if isinstance(g, dict)]
    envs = [e["stats"] for e in envs if isinstance(e, dict)]
    return {
        "env/queue_depth": float(sum(e["pending"] for e in envs)),
        "env/busy_s": float(sum(e["busy_s"] for e in envs)),
        "env/evaluated": float(sum(e["evaluated"] for e in envs)),
        "generators/busy_s": float(sum(g["busy_s"] for g in gens)),
        "generators/episodes": float(sum(g["episodes"] for g in gens)),
        "generators/swap_s": float(sum(g["swap_s"] for g in gens)),
    }


async def first_of(ref: Any, background: asyncio.Task | None) -> Any:
    """Await ``ref``, unless the generation feeder fails first: then its error, not a silent wait forever."""
    if background is None:
        return await ref
    waiting = asyncio.ensure_future(ref)
    await asyncio.wait({waiting, background}, return_when=asyncio.FIRST_COMPLETED)
    if not waiting.done():
        waiting.cancel()
        background.result()  # raises the feeder's error
        raise RuntimeError("the generation feeder stopped")
    return waiting.result()


async def synchronous_step(kind: str, cfg: Any, system: System, feeder: JobFeeder,
                           assembler: GroupAssembler | None = None, display: Any = None
                           ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A synchronous step: a round of stage.batch_episodes episodes, then the learner on exactly
    those of them the buffer accepted (never a wait for one it dropped)."""
    want = accepted(await generate(display, system, feeder, cfg.stage.batch_episodes))
    return await learner_step(kind, cfg, system, feeder, None, assembler, want, display=display)


def accepted(answers: list[Any]) -> int:
    """How many of a synchronous round's episodes the buffer accepted (the rest were duplicates,
    stale or unjudged: an infra verdict). The driver draws that many: waiting for the episodes it
    asked for, one dropped episode left the batch short and the driver waiting for ever."""
    return sum(answer == "accepted" for answer in answers)


async def draw(system: System, background: asyncio.Task | None, episodes: int) -> list[tuple[BatchItem, TrajectoryMeta]]:
    """A batch from the buffer as (buffer item, its meta) pairs: references and numbers only, the
    tokens stay in the object store until the learner's ranks fetch them."""
    if episodes <= 0:  # synchronous, and nothing of the round reached the buffer
        return []
    batch = await first_of(system.buffer.get_batch.remote(max_episodes=episodes), background)
    return [(item, item.meta) for item in batch.items]


async def rerun_lost(system: System, feeder: JobFeeder, lost: list[TrajectoryMeta]) -> None:
    """Trajectories that died with their generator before the learner fetched them: the buffer
    forgets them (so their reruns count once) and their tasks go back to the feeder."""
    if lost:
        await system.buffer.forget.remote([m.episode_id for m in lost])
        feeder.requeue([(feeder.sampler.task_dict(m.task_id), m.episode_id) for m in lost])


async def assemble_groups(cfg: Any, system: System, feeder: JobFeeder, background: asyncio.Task | None,
                          assembler: GroupAssembler, pairs: list[tuple[Any, Any]]
                          ) -> tuple[list[tuple[Any, Any]], list[str], list[Any], dict[str, float]]:
    """Whole groups for one step: draws from the buffer (after ``pairs``, the first draw) until
    stage.batch_episodes episodes of complete groups are ready, with dynamic sampling only
    groups whose rewards differ, or stage.group_draws draws were made. Returns the ready pairs,
    their group keys, every episode drawn and metrics."""
    want = cfg.stage.batch_episodes
    ready, keys, drawn = [], [], [t for _, t in pairs]
    dropped = released = draws = 0
    while True:
        out = assembler.add(pairs)
        draws += 1
        ready += out.ready
        keys += out.groups
        dropped += out.dropped_uniform
        released += out.released_incomplete
        if len(ready) >= want or draws >= cfg.stage.group_draws:
            break
        missing = want - len(ready)
        if background is None:  # synchronous mode: nothing generates unless asked, and only what arrives is drawn
            missing = accepted(await feeder.run_count(missing))
        pairs = await draw(system, background, missing)
        drawn += [t for _, t in pairs]
    metrics = {"groups/draws": float(draws), "groups/ready_episodes": float(len(ready)),
               "groups/dropped_uniform": float(dropped), "groups/released_incomplete": float(released),
               "groups/waiting_episodes": float(assembler.waiting_episodes)}
    return ready, keys, drawn, metrics


async def learner_step(kind: str, cfg: Any, system: System, feeder: JobFeeder, background: asyncio.Task | None,
                       assembler: GroupAssembler | None = None, want: int | None = None, *,
                       display: Any = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One batch of ``want`` episodes (default stage.batch_episodes) from the buffer to the learner
    (whole groups, with an assembler); lost trajectories go back to be rerun."""
    started = time.perf_counter()
    want = cfg.stage.batch_episodes if want is None else want
    # Generating in the background (asynchronous mode), the batch may be minutes away; synchronously
    # it was generated just before (``generate``) and is drawn at once.
    waiting = (phase(display, f"waiting for a batch of {want} episodes", episodes_detail(system, want))
               if background is not None else contextlib.nullcontext())
    async with waiting:
        pairs = await draw(system, background, want)
    drawn = [m for _, m in pairs]
    keys: list[str] | None = None
    group_metrics: dict[str, float] = {}
    if assembler is not None:
        async with phase(display, "forming whole groups of episodes", episodes_detail(system, want)):
            pairs, keys, drawn, group_metrics = await assemble_groups(cfg, system, feeder, background, assembler, pairs)
    metrics: dict[str, Any] = dict(group_metrics)
    offered = len(pairs)
    if kind == "rft":
        kept, rejected = filter_episodes([m for _, m in pairs], cfg.learner.rft)
        metrics.update({f"rft/rejected_{k}": v for k, v in rejected.items()}, **{"rft/kept": len(kept)})
        kept_ids = {m.episode_id for m in kept}
        pairs = [(i, m) for i, m in pairs if m.episode_id in kept_ids]
    ranks = system.learner.world_size
    lost: list[TrajectoryMeta] = []
    if len(pairs) >= ranks:  # each rank needs one; fewer happens after RFT's filter or dynamic sampling
        items = [i for i, _ in pairs]
        advantages = None
        if keys is not None and str(cfg.learner.advantage) == "grpo":
            advantages = group_advantages([m.reward for _, m in pairs], keys)
        async with phase(display, f"training on {len(items)} episodes"):
            result = await system.train_step([i.ref for i in items], [i.meta.num_tokens for i in items],
                                             [i.weight for i in items], advantages)
        lost = [items[p].meta for p in result.lost]
        if result.metrics:
            metrics["learner"] = result.metrics
        else:
            metrics[SKIPPED] = f"{len(lost)} of {len(items)} episodes were lost with their generator, {ranks} needed"
    else:
        if pairs:
            metrics["learner/skipped_small_batch"] = len(pairs)
        metrics[SKIPPED] = skip_reason(kind, offered, len(pairs), ranks)
    await rerun_lost(system, feeder, lost)
    gone = {m.episode_id for m in lost}
    drawn = [m for m in drawn if m.episode_id not in gone]  # run again: they are counted when they come back
    metrics.update(episode_metrics(drawn))
    wall = time.perf_counter() - started
    tokens = sum(m.num_tokens for m in drawn)
    buffer_stats = await system.buffer.stats.remote()
    metrics.update(await actor_load(system, wall))
    if SKIPPED not in metrics:  # a step that trained nothing has no throughput: its wall is a draw from the buffer
        metrics["throughput/tokens_per_s"] = tokens / wall if wall > 0 else 0.0
    metrics.update({
        "buffer": buffer_stats,
        "jobs/reruns": feeder.reruns, "jobs/generator_restarts": feeder.restarts, "jobs/lost": len(lost),
        "step_s": wall,
    })
    episodes = [{"episode_id": m.episode_id, "task_id": m.task_id, "reward": m.reward, "milestone": m.milestone,
                 "stop_reason": m.stop_reason, "turns": m.turns, "versions": m.versions} for m in drawn]
    return metrics, episodes
