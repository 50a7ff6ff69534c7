"""`cuda-agent eval`: an evaluation sweep over KernelBench-format problems, resumable, audited, reported.

    load the problems; read what OUT/results.jsonl holds already    -> the episodes still to run (launch/sweep_records)
    reserve generators and env workers (no learner)                  (actors/topology)
    run each missing episode on the generators, as training does     (actors/generator, env workers)
        each finished episode -> one line of results.jsonl, its final solution under solutions/
    stop the generators and those env workers; on fresh env workers:
        re-time every correct solution against torch.compile max-autotune   -> autotune.jsonl
        audit every solution counted faster: more inputs, adversarial ones  -> audit.jsonl
    write report.md, report.html and summary.json                    (launch/eval_report)

``--solutions DIR`` scores existing solution folders (or KernelBench's one file per problem)
with no policy: the same records, the same post passes, the same report.

Every JSONL line is written (and flushed) as its result arrives, so a run stopped by Ctrl-C or
killed outright loses only what was in flight; rerunning the same command continues, and a
torn last line from a kill is cut off before anything is appended. ``sweep.json`` records what
the results were made with (policy, backend, turn budget, compile mode): a rerun that differs
is refused rather than mixing two sweeps in one report.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import ray
from omegaconf import OmegaConf
from ray.exceptions import RayActorError
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from actors.run_logs import ray_init_options
from actors.seeding import seed_process
from actors.storage import RunStorage, absolute_spec
from actors.system import retry_while_restarting, start_env_workers, start_generators
from actors.topology import Reservation, plan_resources, reserve, start_cluster
from env_pool.evaluate import times_in_turn
from launch.embedded_model import resolve_policy
from launch.sweep_records import (AUDIT, AUTOTUNE, RESULTS, check_identity, episode_id, episode_record, eval_fields,
                                  find_solutions, latest_records, record_machine, recorded_identity, save_solution,
                                  solution_hash)
from protocol.records import RecordWriter, read_records
from protocol.results import EvalResult, Milestone
from rollout.env_client import RayEnvClient
from tasks.loader import load_tasks
from tasks.solution import read_solution
from tasks.task import Task, TaskError

log = logging.getLogger("cuda_agent.eval")

# --------------------------------------------------------------------------- the sweep


@dataclass
class Sweep:
    """What one `cuda-agent eval` run does, resolved from the config and the command line."""

    cfg: Any
    tasks: list[Task]
    policy: str  # a policy spec (rollout/policy.py), or "solutions:DIR"
    out: Path
    solutions: dict[str, dict[str, str]] = field(default_factory=dict)  # --solutions: task id -> files
    storage: RunStorage = field(default_factory=RunStorage)  # how generators on other nodes reach the policy's files
    # The policy as the generators build it (run_sweep sets these, when there is work to do): the
    # spec with its model folder resolved ("embedded" prepared) and made absolute, and the config
    # with model.path resolved where the policy reads it. `policy` stays as given: it is identity.
    served_spec: str = ""
    served_cfg: Any = None

    @property
    def samples(self) -> int:
        return 1 if self.policy.startswith("solutions:") else int(self.cfg.eval.samples_per_task)

    def identity(self) -> dict[str, Any]:
        return {"policy": self.policy, "backend": str(self.cfg.env.backend),
                "max_turns": int(self.cfg.eval.max_turns), "compile_mode": str(self.cfg.env.compile_mode),
                "rules": str(self.cfg.env.rules),
                "confidence": float(self.cfg.env.reward.confidence),
                # the baselines timed in turn with each candidate, or once per task (env.baseline_timing)
                "baseline_timing": "in_turn" if times_in_turn(self.cfg.env, str(self.cfg.env.backend)) else "cached"}


def build_sweep(cfg: Any, policy: str | None, task_paths: list[str] | None, out: str | None,
                solutions_dir: str | None) -> Sweep:
    paths = list(task_paths or cfg.eval.tasks)
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise TaskError(f"problem path {missing[0]!r} does not exist")
    tasks, failures = load_tasks(paths)
    for f in failures:
        log.warning("problem not loaded: %s: %s", f.path, f.reason)
    if not tasks:
        raise TaskError(f"no problems loaded from {paths or 'the starter set'}")
    out_dir = Path(out or cfg.eval.out_dir)
    if solutions_dir:
        found = find_solutions(Path(solutions_dir), tasks)
        if not found:
            raise TaskError(f"no solution in {solutions_dir} matches any of the {len(tasks)} problems: see "
                            "`cuda-agent eval --help` for the layouts it reads")
        tasks = [t for t in tasks if t.id in found]
        return Sweep(cfg, tasks, f"solutions:{Path(solutions_dir).resolve()}", out_dir, found)
    return Sweep(cfg, tasks, policy or cfg.eval.policy, out_dir)


class SweepProgress:
    """Problems done, episodes, passes, faster-than-compile so far, and the ETA (rich)."""

    def __init__(self, sweep: Sweep, records: list[dict[str, Any]], enabled: bool, console: Console | None = None):
        self.samples = sweep.samples
        self.per_task: dict[str, int] = {}
        self.passes = self.faster = self.episodes = 0
        self.total_tasks = len(sweep.tasks)
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f} episodes"),
                            TextColumn("{task.fields[line]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                            disable=not enabled, console=console, transient=False)
        ids = {t.id for t in sweep.tasks}
        for r in records:
            if r["task_id"] in ids:
                self._count(r)
        self.id = self.bar.add_task("eval", total=len(sweep.tasks) * self.samples, completed=self.episodes, line=self.line())

    def _count(self, r: dict[str, Any]) -> None:
        self.episodes += 1
        self.per_task[r["task_id"]] = self.per_task.get(r["task_id"], 0) + 1
        self.passes += r["milestone"] >= Milestone.CORRECT
        self.faster += r["milestone"] >= Milestone.FASTER_THAN_COMPILE

    def line(self) -> str:
        done = sum(n >= self.samples for n in self.per_task.values())
        return (f"problems {done}/{self.total_tasks}  passed {self.passes}/{self.episodes}  "
                f">compile {self.faster}")

    def add(self, r: dict[str, Any]) -> None:
        self._count(r)
        self.bar.update(self.id, advance=1, line=self.line())

    def __enter__(self) -> "SweepProgress":
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.__exit__(*exc)


def write_report_of(sweep: Sweep) -> dict[str, Path]:
    """The report of the episodes the sweep's folder holds (none: {}); runs nothing."""
    from launch.eval_report import write_report

    if not (sweep.out / RESULTS).exists():
        return {}
    return write_report(sweep.out, sweep.cfg, sweep.tasks, recorded_identity(sweep.out, sweep.identity()))


def run_sweep(sweep: Sweep, progress: bool = True, console: Console | None = None) -> Path:
    """Run what is missing, the post passes, and the report; returns the output folder."""
    from launch.eval_report import write_report

    cfg, out = sweep.cfg, sweep.out
    check_identity(out, sweep.identity())
    record_machine(out, sweep.identity()["backend"])
    records = latest_records(read_records(out / RESULTS))
    # An infra failure is the environment's fault, not the policy's: a rerun tries those episodes again.
    done = {r["episode_id"] for r in records if r["failure"] != "infra"}
    records = [r for r in records if r["episode_id"] in done]
    todo = [(t, k) for t in sweep.tasks for k in range(sweep.samples) if episode_id(t, k) not in done]
    if not todo and not pending_passes(sweep, records):  # a finished sweep: only the report is rewritten
        write_report(out, sweep.cfg, sweep.tasks, sweep.identity())
        return out
    seed_process(cfg.seed)
    # Before Ray starts, so that a model path that is not a folder fails at once; only with
    # episodes to run, so that post passes alone never prepare the embedded model.
    spec, sweep.served_cfg = resolve_policy(sweep.policy, cfg) if todo else (sweep.policy, cfg)
    sweep.served_spec = absolute_spec(spec)
    owns_cluster = not ray.is_initialized()
    start_cluster(cfg.cluster, ray_init_options(cfg.logging, out))
    reservation = None
    sweep.storage = RunStorage.for_run(cfg.storage, out, [sweep.served_spec.partition(":")[2]])
    try:
        # No policy: only env workers do anything, each on a GPU of its own.
        reservation = reserve(plan_resources(cfg, learner=False, with_generators=not sweep.solutions))
        writer = RecordWriter(out / RESULTS)
        try:
            with SweepProgress(sweep, records, progress, console) as bar:
                def finished(record: dict[str, Any]) -> None:
                    writer.write(record)
                    records.append(record)
                    bar.add(record)

                if todo:
                    asyncio.run(_run_todo(sweep, reservation, todo, finished))
        finally:
            writer.close()
        asyncio.run(post_passes(sweep, reservation, records, progress))
    finally:
        if reservation is not None:
            reservation.release()
        sweep.storage.close()
        if owns_cluster:
            ray.shutdown()
    write_report(out, sweep.cfg, sweep.tasks, sweep.identity())
    return out


async def _run_todo(sweep: Sweep, reservation: Reservation, todo: list[tuple[Task, int]],
                    finished: Callable[[dict[str, Any]], None]) -> None:
    workers = start_env_workers(reservation, sweep.cfg.env)
    generators: list[Any] = []
    try:
        if sweep.solutions:
            await _score_solutions(sweep, RayEnvClient(workers), todo, finished)
        else:
            generators = start_generators(sweep.served_cfg, reservation, workers, None, sweep.served_spec,
                                          f"cuda-agent-eval-generator-{os.getpid()}", sweep.out,
                                          in_flight(sweep.served_cfg), keep_solution=True, storage=sweep.storage)
            await run_episodes(sweep, generators, todo, finished, RayEnvClient(workers))
    finally:
        for actor in [*generators, *workers]:
            ray.kill(actor, no_restart=True)


def in_flight(cfg: Any) -> int:
    return int(cfg.eval.episodes_in_flight or cfg.rollout.episodes_in_flight)


async def run_episodes(sweep: Sweep, generators: list[Any], todo: list[tuple[Task, int]],
                       finished: Callable[[dict[str, Any]], None], env: RayEnvClient) -> None:
    """Every job on the generators, ``in_flight`` at a time on each; a record the moment each ends.

    One Ray call per episode (not per chunk, as training does), so a result is written the
    moment its episode ends; a generator that dies has its episodes rerun once it is back. An
    episode whose final evaluation failed as infra (the environment's fault) is judged again on
    the files it left, up to eval.infra_retries times: a 200-turn episode is not thrown away
    because a baseline timed badly."""
    max_turns = int(sweep.cfg.eval.max_turns)
    await asyncio.gather(*(g.start.remote(max_turns) for g in generators))
    queue = deque(todo)

    async def lane(generator: Any) -> None:
        while queue:
            task, sample = queue.popleft()
            try:
                [traj] = await generator.run.remote([(task.to_dict(), episode_id(task, sample))], False)
            except RayActorError:
                log.warning("a generator died; rerunning %s sample %d once it is back", task.id, sample)
                queue.appendleft((task, sample))
                await retry_while_restarting(lambda: generator.start.remote(max_turns), (RayActorError,))
                continue
            record = episode_record(traj, task, sample, sweep.out)
            if record["failure"] == "infra" and record["solution"] and sweep.cfg.eval.infra_retries > 0:
                files = read_solution(sweep.out / record["solution"])
                result = await evaluate_retrying(env, task, files, int(sweep.cfg.eval.infra_retries) - 1)
                record.update(eval_fields(result.to_dict()), rejudged=True)
            finished(record)

    await asyncio.gather(*(lane(g) for g in generators for _ in range(in_flight(sweep.cfg))))


async def _score_solutions(sweep: Sweep, env: RayEnvClient, todo: list[tuple[Task, int]],
                           finished: Callable[[dict[str, Any]], None]) -> None:
    async def one(task: Task, sample: int) -> None:
        files = sweep.solutions[task.id]
        started = time.monotonic()
        result = await evaluate_retrying(env, task, files, int(sweep.cfg.eval.infra_retries))
        finished({
            "episode_id": episode_id(task, sample), "task_id": task.id, "level": task.level, "sample": sample,
            **eval_fields(result.to_dict()),
            "stop_reason": "solution", "error": "", "turns": 0, "generated_tokens": 0, "context_tokens": 0,
            "invalid_calls": 0, "token_level": False,
            # Every problem is submitted at once: the evaluation's own time on its worker (with
            # its waits for the worker's timing lane), and apart, submission to verdict (queue, retries).
            "wall_s": round(result.wall_s, 2), "elapsed_s": round(time.monotonic() - started, 2),
            "solution": save_solution(sweep.out, task.id, sample, files), "solution_hash": solution_hash(files),
        })

    await asyncio.gather(*(one(t, k) for t, k in todo))


# --------------------------------------------------------------------------- the post passes


async def evaluate_retrying(env: RayEnvClient, task: Task, files: dict[str, str], retries: int) -> EvalResult:
    """A full evaluation, tried again while it fails for the environment's own reasons (infra: a
    baseline that timed implausibly on a loaded machine, a worker that died). The worker retries
    env.infra_retries times itself; a sweep, which has no later chance, tries ``retries`` more times."""
    result = await env.evaluate(task, files, "full")
    for _ in range(retries):
        if result.failure != "infra":
            break
        log.warning("%s: infra failure (%s); evaluating again", task.id, result.message.splitlines()[0][:200] if result.message else "")
        result = await env.evaluate(task, files, "full")
    return result


def unique_solutions(records: Iterable[dict[str, Any]], min_milestone: int) -> dict[str, dict[str, Any]]:
    """One record per distinct solution (by content hash) at ``min_milestone`` or above, the best kept."""
    chosen: dict[str, dict[str, Any]] = {}
    for r in records:
        h = r.get("solution_hash")
        if h and r["milestone"] >= min_milestone and (h not in chosen or r["milestone"] > chosen[h]["milestone"]):
            chosen[h] = r
    return chosen


def pending_passes(sweep: Sweep, records: list[dict[str, Any]]) -> list[tuple[str, str, dict[str, Any], list[dict[str, Any]]]]:
    """(name, file, env overrides, records of the solutions still to evaluate) of each post pass with work left."""
    cfg, out = sweep.cfg, sweep.out
    task_ids = {t.id for t in sweep.tasks}
    passes = []
    if cfg.eval.max_autotune:
        passes.append(("max-autotune", AUTOTUNE, {"compile_mode": "max-autotune"}, int(Milestone.CORRECT)))
    if cfg.eval.audit:
        passes.append(("audit", AUDIT, {"correctness_inputs": int(cfg.eval.audit_correctness_inputs),
                                        "adversarial_inputs": bool(cfg.eval.audit_adversarial_inputs)},
                       int(cfg.eval.audit_min_milestone)))
    pending = []
    for name, file, overrides, min_milestone in passes:
        done = {r["solution_hash"] for r in read_records(out / file) if r["failure"] != "infra"}
        todo = [r for h, r in unique_solutions(records, min_milestone).items() if h not in done and r["task_id"] in task_ids]
        if todo:
            pending.append((name, file, overrides, todo))
    return pending


async def post_passes(sweep: Sweep, reservation: Reservation, records: list[dict[str, Any]], progress: bool) -> None:
    """Max-autotune re-timing and the hack audit, each on fresh env workers of its own."""
    cfg, out = sweep.cfg, sweep.out
    task_of = {t.id: t for t in sweep.tasks}
    for name, file, overrides, todo in pending_passes(sweep, records):
        log.info("%s: evaluating %d solution(s) on fresh env workers", name, len(todo))
        workers = start_env_workers(reservation, OmegaConf.merge(cfg.env, overrides))
        writer = RecordWriter(out / file)
        try:
            env = RayEnvClient(workers)

            async def one(r: dict[str, Any]) -> None:
                files = read_solution(out / r["solution"])
                result = await evaluate_retrying(env, task_of[r["task_id"]], files, int(cfg.eval.infra_retries))
                fields = eval_fields(result.to_dict())
                writer.write({"solution_hash": r["solution_hash"], "task_id": r["task_id"], "level": r["level"],
                              "was_milestone": r["milestone"], "held": fields["milestone"] >= r["milestone"],
                              **fields, "settings": overrides})

            await asyncio.gather(*(one(r) for r in todo))
        finally:
            writer.close()
            for w in workers:
                ray.kill(w, no_restart=True)
