"""`cuda-agent train`: the training driver. Reads like the recipe; the details live one call away.

    reserve the cluster's resources (actors/topology)      -> fail now if they cannot fit
    start env workers, buffer, generators, learner          (actors/system)
    for each stage of the recipe not yet finished:
        build the stage's trainer, resume its checkpoint    (actors/learner_group -> learner/)
        push its policy to the generators                   (object store; hot swap, no restart)
        repeat: a batch of trajectories from the buffer     (generators keep generating: async)
                (whole groups of one task, with stage.group_size; dynamic sampling drops
                 groups whose rewards all agree)                  (actors/grouping)
                -> a learner step; if it moved the policy, the next version (actors/system owns it)
                -> new weights to the generators every sync_every steps
                -> metrics, progress, checkpoints
        export the stage's models; the next stage starts from them

Stages: single-turn PPO warm-up, RFT (policy fine-tuned on filtered successful episodes),
critic value pretraining (the policy fixed), multi-turn agentic PPO. ``recipe.json`` in the
output folder records finished stages and their exported models, so a rerun resumes at the
stage (and, through its checkpoints, the step) where the last one stopped. Ctrl-C saves a
checkpoint and exits.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ray

from actors.batches import learner_step, synchronous_step
from actors.feeder import JobFeeder, TaskSampler
from actors.grouping import GroupAssembler
from actors.run_logs import ray_init_options
from actors.seeding import seed_process
from actors.storage import RunStorage
from actors.system import LearnerDied, System, retry_while_restarting, start_system
from actors.topology import plan_resources, reserve, start_cluster
from configs.load import ConfigError
from launch.embedded_model import resolve_model_path
from launch.heldout import HeldOutEval
from launch.metrics import MetricsSink
from launch.plots import write_plots
from launch.progress import ProgressDisplay
from protocol.records import RecordWriter
from tasks.answers import answer_tasks
from tasks.loader import load_tasks

log = logging.getLogger("cuda_agent.train")

STAGES = ("single_turn_ppo", "rft", "value_pretrain", "agentic_ppo")
TRAINER_OF = {"single_turn_ppo": "ppo", "rft": "rft", "value_pretrain": "value", "agentic_ppo": "ppo"}
UPDATES_POLICY = {"ppo", "rft"}


@dataclass
class RecipeState:
    """What survives between runs: finished stages, the models they exported, the global step."""

    policy: str  # the policy the next stage starts from
    critic: str | None = None
    done: list[str] = field(default_factory=list)
    step: int = 0  # global step (across stages) of the last finished stage
    version: int = 0  # policy version of ``policy`` (the System owns the running version; this is where it survives a rerun)
    stage_s: dict[str, float] = field(default_factory=dict)  # wall seconds of each finished stage, in the run that finished it

    @classmethod
    def load(cls, out: Path, policy: str, resume: bool, critic: str | None = None) -> "RecipeState":
        path = out / "recipe.json"
        return cls(**json.loads(path.read_text())) if resume and path.exists() else cls(policy=policy, critic=critic)

    def save(self, out: Path) -> None:
        tmp = out / "recipe.json.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, out / "recipe.json")


def stages_of(name: str) -> list[str]:
    return list(STAGES) if name == "recipe" else [name]


def check_sampling(cfg: Any) -> None:
    # PPO's ratio compares the learner's logprobs with the sampler's. The learner scores the
    # model's plain distribution, so the sampler must draw from that same distribution.
    r = cfg.rollout
    if r.temperature != 1.0 or r.top_p != 1.0:
        raise ConfigError(
            f"rollout.temperature={r.temperature} and rollout.top_p={r.top_p}: training needs both at 1.0, "
            "because the learner scores the unmodified distribution; other values are for evaluation only")


def check_learner_ranks(cfg: Any, ranks: int) -> None:
    if cfg.stage.batch_episodes < ranks:
        raise ConfigError(f"stage.batch_episodes={cfg.stage.batch_episodes} is fewer than the {ranks} learner ranks, "
                          f"each of which trains on whole episodes: raise stage.batch_episodes or lower the ranks")
    if ranks > 1 and cfg.learner.zero_stage == 3:
        # Ranks pack different numbers of micro-batches from their shares, and every ZeRO-3
        # forward gathers parameters collectively: unequal counts would deadlock.
        raise ConfigError(f"learner.zero_stage=3 with {ranks} learner ranks is not supported: use learner.zero_stage=2 "
                          f"or one learner rank")


def check_groups(cfg: Any) -> None:
    s, advantage = cfg.stage, str(cfg.learner.advantage)
    if s.group_size < 1 or s.batch_episodes % s.group_size:
        raise ConfigError(f"stage.batch_episodes={s.batch_episodes} must be a positive multiple of "
                          f"stage.group_size={s.group_size}: a step trains on whole groups")
    if s.group_size == 1 and (advantage == "grpo" or s.dynamic_sampling):
        raise ConfigError("learner.advantage=grpo and stage.dynamic_sampling judge an episode against the other "
                          "episodes of its task: set stage.group_size to 2 or more")


def critic_folder(path: str | None) -> str | None:
    """model.critic_path as a folder, checked before anything starts (None: the policy's weights and a fresh value head)."""
    if not path:
        return None
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise ConfigError(f"model.critic_path {path!r} is not a model folder (no config.json): give a critic a "
                          "value-pretraining stage exported (RUN/value_pretrain/export/critic), or unset it")
    return str(folder.resolve())


def training_tasks(cfg: Any) -> tuple[list, list]:
    """The stage's tasks and the files that failed to load: kernel problems, or with env.kind=verifier
    the learning check's questions (tasks/answers.py)."""
    if str(cfg.env.kind) == "verifier":
        return answer_tasks(cfg.env.verifier.answer_file), []
    return load_tasks(list(cfg.stage.tasks))


def train(cfg: Any) -> Path:
    check_sampling(cfg)
    check_groups(cfg)
    critic = critic_folder(cfg.model.critic_path)
    seed_process(cfg.seed)
    out = Path(cfg.logging.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    heldout = HeldOutEval.from_config(cfg, out)  # before Ray starts: a bad held-out set fails now
    with ProgressDisplay(0, enabled=cfg.logging.progress, env_kind=str(cfg.env.kind)) as display:
        owns_cluster = not ray.is_initialized()
        with display.phase("starting Ray"):
            start_cluster(cfg.cluster, ray_init_options(cfg.logging, out))
        plan = plan_resources(cfg)
        check_learner_ranks(cfg, len(plan.learner))
        reservation = reserve(plan)
        tasks, failures = training_tasks(cfg)
        for f in failures:
            log.warning("task not loaded: %s: %s", f.path, f.reason)
        if heldout is not None:
            heldout.warn_overlap(tasks)
        model = resolve_model_path(cfg.model.path, cfg.model.cache_dir)
        state = RecipeState.load(out, model, cfg.stage.resume, critic)
        storage = RunStorage.for_run(cfg.storage, out, [model, critic])
        system = asyncio.run(shown_while(display, f"starting the engines: {len(plan.generators)} vLLM generator(s) and the "
                                              f"DeepSpeed learner ({engine_wait(cfg)})",
                                     start_system(cfg, plan, reservation, model, storage)))
        try:
            for stage in stages_of(str(cfg.stage.name)):
                if stage not in state.done:
                    asyncio.run(run_stage(stage, cfg, system, tasks, state, model, out, heldout, display))
        finally:
            write_plots(out)
            system.shutdown()
            reservation.release()
            storage.close()
            if owns_cluster:
                ray.shutdown()
    return out


async def shown_while(display: ProgressDisplay, what: str, awaitable: Any) -> Any:
    async with display.watched_phase(what):
        return await awaitable


def engine_wait(cfg: Any) -> str:
    """How long the engines take to start, as the display says it while they do."""
    return "a minute or two on a CPU" if int(cfg.cluster.generator_gpus) == 0 else "minutes on a GPU"


async def run_stage(stage: str, cfg: Any, system: System, tasks: list, state: RecipeState,
                    base_model: str, out: Path, heldout: HeldOutEval | None = None,
                    display: ProgressDisplay | None = None) -> None:
    kind, steps, stage_dir = TRAINER_OF[stage], cfg.stage.steps, out / stage
    started = time.monotonic()
    own_display = display is None  # train() passes the run's; it stays up between stages
    display = display or ProgressDisplay(steps, stage, enabled=cfg.logging.progress, env_kind=str(cfg.env.kind))
    display.begin_stage(stage, steps)
    async with display.watched_phase("building the learner (its engines, and its checkpoint if any)"):
        step = await setup_learner(kind, stage_dir, system, state, base_model, steps)
    display.at_step(step)
    sink = MetricsSink.from_config(cfg.logging, resume_step=state.step + step)
    audit = RecordWriter(out / "episodes.jsonl")  # opened once a stage: a torn last line is cut here, not every step
    max_turns = cfg.stage.single_turn_max_turns if stage == "single_turn_ppo" else cfg.rollout.max_turns
    await asyncio.gather(*(g.set_max_turns.remote(max_turns) for g in system.generators))

    async def restarted(generator: Any) -> None:  # a generator came back with the base weights: re-sync it
        await generator.start.remote(max_turns)
        if kind not in UPDATES_POLICY:  # this stage's learner holds no policy: the stage's folder is the policy
            if state.policy != base_model:
                await generator.load_folder.remote(state.policy, system.version)
        elif system.version > 0:  # version 0 is the base model, which it holds already
            await system.sync_weights([generator])

    group_size = cfg.stage.group_size if kind == "ppo" else 1  # groups judge rewards: PPO stages only
    sampler = TaskSampler(tasks, cfg.seed + len(state.done), stage, group_size)
    feeder = JobFeeder(system.generators, sampler, cfg.rollout.episodes_in_flight, restarted)
    assembler = (GroupAssembler(group_size, sampler.group_of, cfg.stage.dynamic_sampling)
                 if group_size > 1 else None)
    background = asyncio.create_task(feeder.run_forever()) if cfg.stage.asynchronous else None
    learner_restarts = 0
    try:
        while step < steps:
            try:
                if background is None:
                    metrics, episodes = await synchronous_step(kind, cfg, system, feeder, assembler, display)
                else:
                    metrics, episodes = await learner_step(kind, cfg, system, feeder, background, assembler,
                                                           display=display)
                await after_step(cfg, system, step, steps, metrics)
            except LearnerDied as err:
                learner_restarts += 1
                log.warning("%s; restarting the learner and resuming it from its last checkpoint", err)
                step = await retry_while_restarting(lambda: restart_learner(kind, stage_dir, system, state,
                                                                            base_model, steps), (LearnerDied,))
                continue
            step += 1
            metrics["jobs/learner_restarts"] = learner_restarts
            sink.log(state.step + step, metrics, stage)
            log_episodes(audit, state.step + step, stage, episodes)
            if heldout is not None:  # in the background: generation and the next step go on
                heldout.maybe_start(state.step + step, system.generators, sink)
            display.update(step, metrics, stage)
    except (KeyboardInterrupt, asyncio.CancelledError):
        if heldout is not None:
            heldout.cancel()
        log.warning("interrupted: saving a checkpoint of %s at step %d", stage, step)
        await system.learn("save", step, {"version": system.version})
        raise
    finally:
        if heldout is not None:
            await heldout.wait()  # its episodes use the generators: done before they change stage
        sink.close()
        audit.close()
        if background is not None:
            background.cancel()
        await feeder.cancel(system.buffer)  # episodes of this stage must not feed the next
    state.version = system.version
    async with display.watched_phase("exporting the stage's models"):
        exported = await system.learn("export", str(stage_dir / "export"), base_model)
    if own_display:
        display.stop()
    state.policy = exported.get("policy", state.policy)
    state.critic = exported.get("critic", state.critic)
    state.done.append(stage)
    state.step += steps
    state.stage_s[stage] = time.monotonic() - started
    state.save(out)
    if not cfg.stage.keep_finished_checkpoints:
        await system.learn("drop_checkpoints")


async def after_step(cfg: Any, system: System, step: int, steps: int, metrics: dict[str, Any]) -> None:
    """Learner step ``step`` (0-based) is done: the policy's next version if it moved, a push to
    the generators every sync_every steps, a checkpoint every checkpoint_every."""
    if metrics.get("learner", {}).get("policy_trained"):
        await system.policy_updated()
    # Nothing to push after a step that left the policy as it was (critic warm-up, value
    # pretraining): a push would relabel the same weights, and the buffer would then drop
    # in-flight episodes as stale. After a stage's last step the next stage serves its export
    # instead (setup_learner).
    if (step + 1) % cfg.stage.sync_every == 0 and step + 1 < steps and system.served < system.version:
        metrics["sync/swap_s"] = await system.sync_weights()
    if (step + 1) % cfg.stage.checkpoint_every == 0 or step + 1 == steps:
        await system.learn("save", step + 1, {"version": system.version})


async def restart_learner(kind: str, stage_dir: Path, system: System, state: RecipeState, base_model: str,
                          steps: int) -> int:
    await system.restart_learner()
    return await setup_learner(kind, stage_dir, system, state, base_model, steps)


async def setup_learner(kind: str, stage_dir: Path, system: System, state: RecipeState, base_model: str,
                        steps: int) -> int:
    """Build (or, after a death, rebuild) the stage's trainer from its latest checkpoint, and
    settle the policy version of the weights it holds. Returns the step it resumes at.

    A stage starts from ``state.policy``, whose version is ``state.version``: the generators load
    it, while the learner builds its engines, unless they serve it already (after value
    pretraining, which leaves the policy as it was). A trainer rebuilt mid-stage (after a
    learner death, or by a rerun that resumes a checkpoint) holds weights the generators never
    had: they are the next version, pushed at once."""
    rebuilt = system.version > state.version  # this stage already moved the version in this process
    if not rebuilt:
        await system.set_version(state.version)
    load = None
    if not rebuilt and state.policy != base_model and system.served < system.version:
        load = asyncio.ensure_future(system.load_policy(state.policy, system.version))
    try:
        resumed = await system.learn("setup", kind, str(stage_dir), state.policy, state.critic, steps)
    finally:
        if load is not None:  # finished (or failed) before anything else touches the generators
            await load
    step = int(resumed.get("step", 0))
    if kind in UPDATES_POLICY and (rebuilt or step):
        await system.set_version(max(system.version, int(resumed.get("version", 0))) + 1)
        await system.sync_weights()
    return step


def log_episodes(audit: RecordWriter, step: int, stage: str, episodes: list[dict[str, Any]]) -> None:
    """One line per trained episode: the audit trail of what the learner saw, and when."""
    for e in episodes:
        audit.write({"step": step, "stage": stage, **e})


