"""EpisodeRunner: many episodes at once on one policy, each in its own workspace.

``episodes_in_flight`` bounds concurrency (a semaphore); asyncio-throttle bounds the *rate* of
generation and environment requests, so a burst of episodes that all compile at once queues
here instead of flooding the env workers. Results stream out as episodes finish, in whatever
order that is: a slow episode never holds up the others.
"""
from __future__ import annotations

import asyncio
import inspect
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Iterable

from asyncio_throttle import Throttler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from protocol.trajectory import Trajectory
from rollout.env_client import EnvClient
from rollout.episode import EpisodeSettings, run_episode
from rollout.policy import Generation, GenerationRequest, Policy
from rollout.skill import skill_text
from rollout.toolbox import ToolBox
from rollout.workspace import Workspace, default_root


@dataclass
class Job:
    """One episode to run: a task and the id its trajectory will carry (stable across reruns)."""

    task: Any
    episode_id: str


class ThrottledPolicy:
    """The policy, with generation requests admitted at most ``rate`` per second."""

    def __init__(self, policy: Policy, throttler: Throttler):
        self.inner, self.throttler = policy, throttler
        self.token_level, self.tokenizer = policy.token_level, policy.tokenizer

    @property
    def version(self) -> int:
        return self.inner.version

    async def generate(self, request: GenerationRequest) -> Generation:
        async with self.throttler:
            pass  # admission only: the request itself may then take as long as it needs
        return await self.inner.generate(request)


class ThrottledEnv:
    """The environment client, with requests admitted at most ``rate`` per second."""

    def __init__(self, env: EnvClient, throttler: Throttler):
        self.inner, self.throttler = env, throttler

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        async def throttled(*args: Any, **kwargs: Any) -> Any:
            async with self.throttler:
                pass
            return await method(*args, **kwargs)

        return throttled


@dataclass
class Activity:
    """What the runner's episodes are doing now, for a live view of a long wait (launch/progress.py):
    episodes begun and ended, turns generated, and how many episodes wait on the policy or on the
    environment at this moment."""

    started: int = 0
    finished: int = 0
    turns: int = 0
    generating: int = 0
    in_env: int = 0

    def snapshot(self) -> dict[str, int]:
        return dict(self.__dict__)


class CountedPolicy:
    """The policy, its calls counted into an Activity (a turn ends when its generation does)."""

    def __init__(self, policy: Any, activity: Activity):
        self.inner, self.activity = policy, activity
        self.token_level, self.tokenizer = policy.token_level, policy.tokenizer

    @property
    def version(self) -> int:
        return self.inner.version

    async def generate(self, request: GenerationRequest) -> Generation:
        self.activity.generating += 1
        try:
            return await self.inner.generate(request)
        finally:
            self.activity.generating -= 1
            self.activity.turns += 1


class CountedEnv:
    """The environment client, the requests in flight counted into an Activity."""

    def __init__(self, env: Any, activity: Activity):
        self.inner, self.activity = env, activity

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)
        if not inspect.iscoroutinefunction(method):
            return method

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.activity.in_env += 1
            try:
                return await method(*args, **kwargs)
            finally:
                self.activity.in_env -= 1

        return counted


class EpisodeRunner:
    def __init__(self, policy: Policy, env: EnvClient, settings: EpisodeSettings, *, backend: str,
                 workspace_root: str | Path, observation_max_chars: int = 4000, episodes_in_flight: int = 16,
                 generate_rate: float = 0.0, env_rate: float = 0.0, keep_workspaces: bool = False,
                 skill_in_prompt: bool = True, keep_solution: bool = False, rules: str = "strict",
                 answer_file: str | None = None):
        self.activity = Activity()
        policy = ThrottledPolicy(policy, Throttler(generate_rate)) if generate_rate > 0 else policy
        env = ThrottledEnv(env, Throttler(env_rate)) if env_rate > 0 else env
        self.policy, self.env = CountedPolicy(policy, self.activity), CountedEnv(env, self.activity)
        self.settings, self.backend = settings, backend
        self.workspace_root = Path(workspace_root).expanduser()
        self.observation_max_chars = observation_max_chars
        self.slots = asyncio.Semaphore(episodes_in_flight)
        self.keep_workspaces = keep_workspaces
        self.skill, self.skill_in_prompt = skill_text(backend, rules), skill_in_prompt
        # Evaluation keeps what the final evaluation judged (traj.meta["solution"]) for its report and audit.
        self.keep_solution = keep_solution
        self.answer_file = answer_file  # the learning check (env.kind=verifier): the file its verifier judges

    @classmethod
    def from_config(cls, cfg: Any, policy: Policy, env: EnvClient, max_turns: int | None = None,
                    episodes_in_flight: int | None = None, keep_solution: bool = False) -> "EpisodeRunner":
        """A runner wired from the whole Config's rollout and env sections (workspaces beside the
        environment's work dir). ``max_turns`` and ``episodes_in_flight`` override the config's
        (a stage's or a sweep's budget)."""
        settings = EpisodeSettings.from_config(cfg.rollout, cfg.env.reward.failure, max_turns)
        return cls(
            policy, env, settings,
            backend=str(cfg.env.backend),
            workspace_root=default_root(cfg.env.work_dir),
            observation_max_chars=cfg.rollout.observation_max_chars,
            episodes_in_flight=episodes_in_flight or cfg.rollout.episodes_in_flight,
            generate_rate=cfg.rollout.generation_rps,
            skill_in_prompt=cfg.rollout.skill_in_prompt,
            keep_solution=keep_solution,
            rules=str(cfg.env.rules),
            answer_file=cfg.env.verifier.answer_file if str(cfg.env.kind) == "verifier" else None,
        )

    async def run_one(self, job: Job) -> Trajectory:
        async with self.slots:
            self.activity.started += 1
            ws = Workspace.create(self.workspace_root, job.episode_id, job.task, self.backend, self.skill)
            try:
                tools = ToolBox(job.task, ws, self.env, self.backend, self.observation_max_chars, self.answer_file)
                traj = await run_episode(job.task, self.policy, tools, self.settings,
                                         self.skill if self.skill_in_prompt else "", self.backend, job.episode_id)
                if self.keep_solution:
                    traj.meta["solution"] = ws.solution_files()
                return traj
            finally:
                self.activity.finished += 1
                if not self.keep_workspaces:
                    # In a thread: the episodes of a batch end together, and their rmtrees (ms each)
                    # must not hold up the event loop that feeds the other episodes' turns.
                    await asyncio.to_thread(ws.remove)

    async def run_many(self, jobs: Iterable[Job], progress: bool = True, console: Any = None) -> AsyncIterator[Trajectory]:
        """Run every job, yielding trajectories as they finish, with a live progress line (on ``console``:
        rich's own, stdout, when None)."""
        jobs = list(jobs)
        stats = EpisodeStats()
        with _progress(progress, console) as bar:
            task_id = bar.add_task("episodes", total=len(jobs), stats="")
            for done in asyncio.as_completed([self.run_one(j) for j in jobs]):
                traj = await done
                stats.add(traj)
                bar.update(task_id, advance=1, stats=stats.line())
                yield traj


def jobs_for(tasks: Iterable[Any], samples: int = 1) -> list[Job]:
    return [Job(task, f"{task.id.replace('/', '-')}-{k}-{uuid.uuid4().hex[:8]}") for task in tasks for k in range(samples)]


@dataclass
class EpisodeStats:
    """Running totals for the progress line and the end-of-run summary."""

    episodes: int = 0
    reward_sum: float = 0.0
    generated_tokens: int = 0
    milestones: Counter = field(default_factory=Counter)
    stops: Counter = field(default_factory=Counter)

    def add(self, traj: Trajectory) -> None:
        self.episodes += 1
        self.reward_sum += traj.reward
        self.generated_tokens += traj.num_generated
        self.milestones[traj.milestone] += 1
        self.stops[traj.stop_reason] += 1

    @property
    def mean_reward(self) -> float:
        return self.reward_sum / self.episodes if self.episodes else 0.0

    def line(self) -> str:
        m = self.milestones
        return (f"reward {self.mean_reward:+.2f}  correct {sum(v for k, v in m.items() if k >= 1)}"
                f"  >eager {sum(v for k, v in m.items() if k >= 2)}  >compile {m.get(3, 0)}")


def _progress(enabled: bool, console: Any = None) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[stats]}"), disable=not enabled, transient=False, console=console)
