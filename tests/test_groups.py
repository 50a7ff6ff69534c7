"""Group sampling: the sampler hands a task out group_size times under one key, the assembler
serves only whole groups (and, with dynamic sampling, only groups whose rewards differ), and
the group-relative advantage is the reward against its group's mean and spread, on every
generated token of the episode."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from actors.feeder import TaskSampler
from actors.grouping import GroupAssembler
from configs.load import ConfigError, load_config
from launch.train import check_groups
from learner.batching import flatten
from learner.groups import group_advantages, informative_groups
from learner.ppo import episode_token_advantages
from tasks.task import Task

try:
    from tests.learner_toy import OBSERVATION, PROMPT, make_trajectory
except ImportError:  # tests/ is on sys.path itself under pytest's default import mode
    from learner_toy import OBSERVATION, PROMPT, make_trajectory


def _episode(name: str, reward: float, tokens: int = 2):
    return make_trajectory(name, PROMPT, [([20 + k for k in range(tokens)], [-1.0] * tokens, 0)], OBSERVATION, reward)


def test_group_advantage_is_the_reward_against_its_groups_mean_over_its_std():
    rewards = [3.0, -1.0, 1.0, 2.0, 2.0, 5.0]
    groups = ["a", "a", "a", "b", "b", "c"]
    adv = group_advantages(rewards, groups)
    std_a = math.sqrt(((3 - 1) ** 2 + (-1 - 1) ** 2 + 0) / 3)
    assert adv[:3] == pytest.approx([2 / std_a, -2 / std_a, 0.0], rel=1e-5)
    assert adv[3:] == [0.0, 0.0, 0.0], "equal rewards, and a group of one, carry no group-relative signal"
    with pytest.raises(ValueError, match="one key per episode"):
        group_advantages([1.0], ["a", "b"])


def test_dynamic_sampling_keeps_only_groups_whose_rewards_differ():
    keep = informative_groups([-1.0, -1.0, 3.0, 1.0, 3.0, 3.0], ["fail", "fail", "mixed", "mixed", "solved", "solved"])
    assert keep == [False, False, True, True, False, False]


def test_the_sampler_hands_each_task_out_group_size_times_under_one_group_key():
    tasks = [Task(id=f"t{i}", level=1, source="class Model: pass\n") for i in range(3)]
    sampler = TaskSampler(tasks, seed=0, group_size=4)
    jobs = [sampler.next() for _ in range(12)]
    ids = [episode_id for _, episode_id in jobs]
    assert len(set(ids)) == 12, "episode ids stay unique within a group"
    for g in range(3):
        members = jobs[4 * g:4 * g + 4]
        assert len({task["id"] for task, _ in members}) == 1, "a group is one task"
        assert len({sampler.group_of(i) for _, i in members}) == 1
    assert len({sampler.group_of(i) for i in ids}) == 3
    assert {task["id"] for task, _ in jobs} == {"t0", "t1", "t2"}, "groups still pass over every task"
    plain = TaskSampler(tasks, seed=0)
    assert len({plain.group_of(plain.next()[1]) for _ in range(6)}) == 6, "group_size 1: every episode its own group"


def test_the_assembler_serves_whole_groups_and_dynamic_sampling_drops_the_uniform_ones():
    group = {"a1": "a", "a2": "a", "b1": "b", "b2": "b", "c1": "c", "c2": "c"}
    assembler = GroupAssembler(2, group.__getitem__, dynamic_sampling=True)
    first = assembler.add([("item-a1", _episode("a1", 3.0)), ("item-b1", _episode("b1", -1.0)),
                           ("item-c1", _episode("c1", 1.0))])
    assert first.ready == [] and assembler.waiting_episodes == 3, "no group is complete yet"
    second = assembler.add([("item-a2", _episode("a2", -1.0)), ("item-b2", _episode("b2", -1.0))])
    assert [item for item, _ in second.ready] == ["item-a1", "item-a2"] and second.groups == ["a", "a"]
    assert second.dropped_uniform == 2, "group b failed twice: no signal, dropped"
    assert assembler.waiting_episodes == 1


def test_a_group_missing_a_member_is_released_as_it_is_after_max_wait_draws():
    assembler = GroupAssembler(3, lambda episode_id: episode_id[0], dynamic_sampling=False, max_wait=2)
    assert assembler.add([("x1", _episode("x1", 1.0)), ("x2", _episode("x2", 2.0))]).ready == []
    assert assembler.add([]).ready == [], "one draw later the third member may still come"
    out = assembler.add([])
    assert [item for item, _ in out.ready] == ["x1", "x2"] and out.released_incomplete == 1


def test_grpo_spreads_each_episodes_advantage_over_its_generated_tokens():
    batch = flatten([_episode("a", 3.0, tokens=2), _episode("b", -1.0, tokens=3)])
    assert episode_token_advantages(batch, [0.5, -2.0]).tolist() == [0.5, 0.5, -2.0, -2.0, -2.0]
    with pytest.raises(ValueError, match="one group-relative advantage per trajectory"):
        episode_token_advantages(batch, None)


def test_group_options_that_cannot_work_are_refused_before_any_work():
    ok = load_config([], ["stage.group_size=4", "stage.batch_episodes=16", "learner.advantage=grpo",
                          "stage.dynamic_sampling=true"])
    check_groups(ok)
    with pytest.raises(ConfigError, match="multiple of stage.group_size"):
        check_groups(load_config([], ["stage.group_size=3", "stage.batch_episodes=16"]))
    with pytest.raises(ConfigError, match="group_size to 2 or more"):
        check_groups(load_config([], ["learner.advantage=grpo"]))
    with pytest.raises(ConfigError, match="group_size to 2 or more"):
        check_groups(load_config([], ["stage.dynamic_sampling=true"]))


def test_a_ppo_trainer_refuses_grpo_with_a_kl_penalty_in_the_reward():
    from configs.schema import LearnerConfig
    from learner.ppo import PPOTrainer

    with pytest.raises(ValueError, match="kl_mode=loss"):
        PPOTrainer(LearnerConfig(advantage="grpo", kl_coef=0.1), None, None, reference=object())


def _driver_with_buffer(monkeypatch, queue, learner):
    """actors.batches (the step's data plane) with its buffer reads served from ``queue`` in this
    process, and the System of one learner and no generators a step needs."""
    import actors.batches as driver
    from actors.system import System

    try:
        from tests.test_policy_version import Remote
    except ImportError:
        from test_policy_version import Remote

    async def nothing(*args, **kwargs):
        return {}

    monkeypatch.setattr(driver, "actor_load", nothing)
    return driver, System([], Remote(queue), [], learner)


def test_a_step_trains_on_whole_informative_groups_with_their_group_relative_advantages(monkeypatch):
    """A learner step (actors/batches.learner_step), synchronous mode, group_size 2, dynamic
    sampling, grpo: the first draw holds a group that failed twice, which is dropped; the driver
    generates more until the batch is full of groups whose rewards differ, and the learner gets
    each episode's advantage against its own group."""
    import asyncio

    from actors.learner_group import StepResult
    from actors.trajectory_queue import TrajectoryQueue
    from protocol.trajectory_meta import TrajectoryMeta

    cfg = load_config([], ["stage.group_size=2", "stage.batch_episodes=4", "stage.dynamic_sampling=true",
                           "learner.advantage=grpo", "stage.asynchronous=false"])
    tasks = [Task(id=name, level=1, source="class Model: pass\n") for name in ("fails", "mixed", "solved")]
    sampler = TaskSampler(tasks, seed=4, group_size=2)  # seed 4's first pass: fails, mixed, solved
    queue = TrajectoryQueue(capacity=16)
    outcomes = {"fails": [-1.0, -1.0], "mixed": [3.0, -1.0], "solved": [3.0, 1.0]}

    class Feeder:
        reruns = restarts = 0

        def __init__(self):
            self.sampler, self.generated = sampler, []

        async def run_count(self, n):  # as JobFeeder.run_count: the buffer's answer for each episode
            answers = []
            for _ in range(n):
                task, episode_id = sampler.next()
                k = sum(1 for e in self.generated if e.task_id == task["id"]) % 2
                traj = _episode(episode_id, outcomes[task["id"]][k])
                traj.task_id = task["id"]
                self.generated.append(traj)
                answers.append(await queue.put(TrajectoryMeta.of(traj), traj))
            return answers

    class Learner:
        world_size = 1
        calls = []

        async def step(self, refs, sizes, weights, version=0, episode_advantages=None):
            self.calls.append(([t.task_id for t in refs], episode_advantages))
            return StepResult({"policy_trained": 1.0})

    learner = Learner()
    driver, system = _driver_with_buffer(monkeypatch, queue, learner)
    feeder = Feeder()
    assembler = GroupAssembler(2, sampler.group_of, dynamic_sampling=True)

    async def run():
        await feeder.run_count(4)  # what run_stage does before a synchronous step
        return await driver.learner_step("ppo", cfg, system, feeder, None, assembler)

    metrics, episodes = asyncio.run(run())
    (tasks_trained, advantages), = learner.calls
    assert sorted(set(tasks_trained)) == ["mixed", "solved"] and len(tasks_trained) == 4, tasks_trained
    assert metrics["groups/dropped_uniform"] == 2.0 and metrics["groups/draws"] == 2.0
    for task in ("mixed", "solved"):
        adv = [a for t, a in zip(tasks_trained, advantages) if t == task]
        assert sorted(adv) == pytest.approx([-1.0, 1.0], rel=1e-5), f"{task}: two episodes, one above and one below the group mean"
    assert len(episodes) == 6, "every drawn episode is logged, the dropped group's too"


def test_a_synchronous_step_trains_on_what_reached_the_buffer_when_an_episode_is_dropped(monkeypatch):
    """It waited for stage.batch_episodes items with no timeout: one episode the environment failed
    to judge (an infra verdict: never trained on) left the driver waiting for ever."""
    import asyncio

    from actors.learner_group import StepResult
    from actors.trajectory_queue import TrajectoryQueue
    from protocol.trajectory_meta import TrajectoryMeta

    cfg = load_config([], ["stage.batch_episodes=4", "stage.asynchronous=false"])
    queue = TrajectoryQueue(capacity=16)

    class Feeder:  # JobFeeder.run_count's contract: the buffer's answer for each episode it ran
        reruns = restarts = 0

        async def run_count(self, n):
            answers = []
            for k in range(n):
                traj = _episode(f"e{k}", 1.0)
                if k == 2:
                    traj.final_eval = {"failure": "infra", "message": "the env worker died"}
                answers.append(await queue.put(TrajectoryMeta.of(traj), traj))
            return answers

    class Learner:
        world_size = 1
        trained: list = []

        async def step(self, refs, sizes, weights, version=0, episode_advantages=None):
            self.trained.append([t.episode_id for t in refs])
            return StepResult({"policy_trained": 1.0})

    learner = Learner()
    driver, system = _driver_with_buffer(monkeypatch, queue, learner)
    metrics, episodes = asyncio.run(asyncio.wait_for(driver.synchronous_step("ppo", cfg, system, Feeder()), 30))
    assert learner.trained == [["e0", "e1", "e3"]] and len(episodes) == 3
    assert queue.stats().dropped_unjudged == 1


def test_a_step_with_nothing_to_train_on_says_why_and_logs_no_throughput(monkeypatch):
    """RFT's filter keeps no episode of a batch that all failed: the step trains nothing, and the
    progress line said "810382 tok/s" (the batch's tokens over the time it took to read it)."""
    import asyncio

    from actors.trajectory_queue import TrajectoryQueue
    from protocol.step_record import SKIPPED, TOKENS_PER_S
    from protocol.trajectory_meta import TrajectoryMeta

    cfg = load_config([], ["stage.batch_episodes=4", "stage.asynchronous=false"])
    queue = TrajectoryQueue(capacity=8)

    class Learner:
        world_size = 1

        async def step(self, *args, **kwargs):
            raise AssertionError("nothing passed RFT's filter: the learner must not be called")

    driver, system = _driver_with_buffer(monkeypatch, queue, Learner())

    async def run():
        for k in range(4):
            traj = _episode(f"ep-{k}", -1.0)
            await queue.put(TrajectoryMeta.of(traj), traj)
        feeder = SimpleNamespace(reruns=0, restarts=0)  # synchronous: nothing to generate once the batch is there
        return await driver.learner_step("rft", cfg, system, feeder, None)

    metrics, episodes = asyncio.run(run())
    assert metrics[SKIPPED] == "0 of 4 episodes passed RFT's filter (learner.rft), 1 needed (one per learner rank)"
    assert TOKENS_PER_S not in metrics and "learner" not in metrics and len(episodes) == 4


def test_a_trajectory_the_learner_found_lost_is_forgotten_rerun_and_not_reported_as_trained(monkeypatch):
    """The driver never fetches a trajectory (its meta holds every number it decides on); the
    learner's ranks do, and a trajectory that died with its generator comes back from the step as
    lost: the buffer forgets it, its task goes back to the feeder, and the step's audit lines and
    reward leave it out (it is counted when its rerun is trained)."""
    import asyncio

    from actors.learner_group import StepResult
    from actors.trajectory_queue import TrajectoryQueue
    from protocol.trajectory_meta import TrajectoryMeta

    cfg = load_config([], ["stage.batch_episodes=3", "stage.asynchronous=false"])
    queue = TrajectoryQueue(capacity=8)

    class Learner:
        world_size = 1

        async def step(self, refs, sizes, weights, version=0, episode_advantages=None):
            assert [t.episode_id for t in refs] == ["e0", "e1", "e2"]
            return StepResult({"policy_trained": 1.0}, lost=[1])

    class Feeder:
        reruns = restarts = 0
        requeued: list = []
        sampler = SimpleNamespace(task_dict=lambda task_id: {"id": task_id})

        def requeue(self, jobs):
            self.requeued += jobs

    driver, system = _driver_with_buffer(monkeypatch, queue, Learner())

    async def run():
        for k, reward in enumerate((1.0, -1.0, 1.0)):
            traj = _episode(f"e{k}", reward)
            await queue.put(TrajectoryMeta.of(traj), traj)
        return await driver.learner_step("ppo", cfg, system, feeder, None)

    feeder = Feeder()
    metrics, episodes = asyncio.run(run())
    assert feeder.requeued == [({"id": _episode("e1", -1.0).task_id}, "e1")]
    assert [e["episode_id"] for e in episodes] == ["e0", "e2"] and metrics["jobs/lost"] == 1
    assert metrics["reward/mean"] == 1.0 and metrics["learner"] == {"policy_trained": 1.0}
    assert queue.stats().lost == 1, "the buffer did not forget it: its rerun would be answered duplicate"
