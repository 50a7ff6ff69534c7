"""LearnerActor: the DeepSpeed engines of one training stage, behind a Ray actor.

One actor is one learner rank; a LearnerGroup is the ranks of one learner (one per learner
GPU, or ``cluster.learner_cpu_ranks`` over gloo on the CPU): data-parallel, or, with
``learner.sequence_parallel_size`` n > 1, data-parallel groups of n consecutive ranks that
share each row (learner/sequence_parallel.py). The driver builds
the trainer a stage needs (PPO with a critic, RFT, or value pretraining) on every rank, feeds
each rank its share of a batch of trajectories from the object store, sends the policy's
weights to the generators after a step (actors/weight_sync.py) and has it checkpoint. A
stage ends by exporting its models as Hugging Face folders, which the next stage starts
from: the recipe's hand-offs (RFT's policy into PPO, value pretraining's critic into PPO) are
plain folders a person can load, not state hidden in a process.

Every rank takes part in every call (DeepSpeed's steps, saves and ZeRO-3 gathers are
collective); rank 0's answer is the group's. A rank that dies breaks the others' process
group, so the group restarts whole: every rank is replaced and resumes from the checkpoint.
"""
from __future__ import annotations

import asyncio
import gc
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import ray
from omegaconf import OmegaConf

from actors.buffer_client import fetch
from actors.seeding import derived_seed, seed_process
from actors.storage import RunStorage, node_id
from actors.weight_sync import WeightSender
from configs.schema import Config
from learner.checkpoint import LATEST, export_hf, load_checkpoint, prune_checkpoints, save_checkpoint
from learner.weights import iter_weight_buckets

TRAINERS = ("ppo", "rft", "value")
SUMMED_METRICS = ("tokens", "generated_tokens", "micro_batches")


def _trainer(kind: str, cfg: Any, policy_path: str, critic_path: str | None, total_steps: int):
    dtype = cfg.model.dtype
    if kind == "ppo":
        from learner.ppo import PPOTrainer

        return PPOTrainer.create(cfg.learner, policy_path, critic_path, dtype=dtype, total_steps=total_steps,
                                 reward_span=reward_span(cfg.env.reward))
    if kind == "rft":
        from learner.rft import RFTTrainer

        return RFTTrainer.create(cfg.learner, policy_path, dtype=dtype, total_steps=total_steps)
    if kind == "value":
        from learner.value_pretrain import ValuePretrainer

        return ValuePretrainer.create(cfg.learner, critic_path or policy_path, dtype=dtype, total_steps=total_steps)
    raise ValueError(f"trainer kind must be one of {TRAINERS}, got {kind!r}")


def reward_span(reward: Any) -> float:
    """The spread of the milestone rewards (top minus bottom): the scale of the value clip."""
    values = [reward.failure, reward.correct, reward.faster_than_eager, reward.faster_than_compile]
    return float(max(values) - min(values))


class StorageMirror:
    """A checkpoint root's copy on this node (``local``) and the run folder's root it stands for."""

    def __init__(self, storage: RunStorage, local: Path, remote: Path):
        self.storage, self.local, self.remote = storage, local, remote

    def _remote(self, path: Path) -> Path:
        return self.remote / path.relative_to(self.local)

    def publish(self, path: Path) -> None:
        self.storage.publish(self._remote(path))

    def remove(self, path: Path) -> None:
        self.storage.remove(self._remote(path))


@ray.remote
class LearnerActor:
    def __init__(self, cfg: Mapping[str, Any], rank: int = 0, world_size: int = 1, master: tuple[str, int] | None = None,
                 storage: RunStorage | None = None):
        os.environ.setdefault("DS_ACCELERATOR", "cpu" if not _has_gpu() else "cuda")
        self.cfg = OmegaConf.merge(OmegaConf.structured(Config), cfg)
        seed_process(derived_seed(self.cfg.seed, "learner", rank))  # a checkpoint's RNG states win on resume
        self.storage = storage or RunStorage()  # None: every path in place
        self.publishes = True  # the lowest rank on its node sends the node's checkpoint files (set_publisher)
        self.rank, self.world_size = rank, world_size
        self.master = master or WeightSender.address()
        if world_size > 1:  # one process a rank; Ray shows each rank only its own GPU, hence local rank 0
            os.environ.update(MASTER_ADDR=self.master[0], MASTER_PORT=str(self.master[1]), RANK=str(rank),
                              WORLD_SIZE=str(world_size), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        self.trainer = None
        self.kind = ""
        self.batch: list[Any] = []  # the trajectories of the last fetch, until the step that trains on them
        self.checkpoints = Path()
        self.sender = WeightSender(rank)

    def master_address(self) -> tuple[str, int]:
        """Where the other ranks meet rank 0 (its node and a port it found free)."""
        return self.master

    def node(self) -> str:
        return node_id()

    def set_publisher(self, publishes: bool) -> None:
        self.publishes = publishes

    def setup(self, kind: str, stage_dir: str, policy_path: str, critic_path: str | None, total_steps: int) -> dict[str, Any]:
        """Build the stage's trainer and resume it from the stage's latest checkpoint, if any."""
        self.kind = kind
        self.trainer = None  # the previous stage's engines go before this stage's are built
        gc.collect()
        critic = str(self.storage.fetch(critic_path)) if critic_path else None
        self.trainer = _trainer(kind, self.cfg, str(self.storage.fetch(policy_path)), critic, total_steps)
        self.sender.new_trainer()
        self.checkpoints = Path(stage_dir) / "checkpoints"
        state = load_checkpoint(self._fetch_latest(), self.trainer.engines())
        if state is not None:
            self.trainer.load_state(state["trainer"])
        return state or {}

    def _fetch_latest(self) -> Path:
        """This node's checkpoint root, holding the newest checkpoint (only that one is copied)."""
        marker = self.storage.fetch(self.checkpoints / LATEST, missing_ok=True)
        if marker.exists():
            self.storage.fetch(self.checkpoints / marker.read_text().strip())
        return self.storage.place(self.checkpoints)

    def fetch(self, batch: list[Any]) -> list[int]:
        """This rank's trajectories for its next step, out of the object store (``batch`` holds their
        refs, nested, so unresolved); returns the positions of those lost with their generator."""
        fetched = fetch(batch)
        self.batch = fetched.trajectories
        return fetched.lost

    def step(self, weights: list[float] | None = None, version: int = 0,
             episode_advantages: list[float] | None = None) -> dict[str, float]:
        """One learner step on the trajectories of this rank's last ``fetch``: ``weights`` their loss
        weights, ``version`` the policy version of the weights the trainer holds (the driver's
        System owns it) and ``episode_advantages`` their group-relative advantages (learner.advantage=grpo)."""
        trajectories, self.batch = self.batch, []
        if self.kind == "ppo":
            return self.trainer.step(trajectories, weights, version=version, episode_advantages=episode_advantages)
        return self.trainer.step(trajectories, weights)

    def save(self, step: int, extra: dict[str, Any]) -> str:
        state = {"trainer": self.trainer.state(), **extra}
        local, keep = self.storage.place(self.checkpoints), self.cfg.stage.keep_checkpoints
        mirror = StorageMirror(self.storage, local, self.checkpoints) if local != self.checkpoints and self.publishes else None
        folder = save_checkpoint(local, step, self.trainer.engines(), state, keep, mirror)
        if mirror is not None and self.rank != 0:  # rank 0 prunes the run folder; this node's copies are this rank's
            prune_checkpoints(local, keep)
        return str(self.checkpoints / folder.name)

    def drop_checkpoints(self) -> None:
        """A finished stage's checkpoints go once its export is written: the next stage starts from the export."""
        if self.rank == 0:
            self.storage.remove(self.checkpoints)
        elif self.publishes:
            shutil.rmtree(self.storage.place(self.checkpoints), ignore_errors=True)

    def export_weights(self, bucket_mb: int) -> list[Any]:
        """The policy's weights as object-store buckets of (name, CPU tensor) pairs (rank 0's; the others gather)."""
        buckets = iter_weight_buckets(self._policy(), bucket_mb * 2**20)
        if self.rank != 0:
            for _ in buckets:  # the gathers are collective; only rank 0's copies travel
                pass
            return []
        return [ray.put([(n, t.detach().cpu().clone()) for n, t in bucket]) for bucket in buckets]

    def weight_layouts(self, bucket_mb: int) -> list[tuple[list, int]]:
        return self.sender.layouts(self._policy(), bucket_mb * 2**20)

    def weight_group_address(self) -> tuple[str, int]:
        return self.sender.address()

    def join_weight_group(self, index: int, host: str, port: int, world_size: int) -> None:
        if self.rank == 0:
            self.sender.join(index, host, port, world_size)

    def broadcast_weights(self, index: int, bucket_mb: int) -> float:
        return self.sender.broadcast(index, self._policy(), bucket_mb * 2**20)

    def share_weights(self, bucket_mb: int) -> tuple[str, list[tuple[bytes, list]]]:
        return self.sender.share(self._policy(), bucket_mb * 2**20)

    def release_weights(self) -> None:
        self.sender.release()

    def _policy(self) -> Any:
        return self.trainer.engines()["policy"]

    def export(self, out_dir: str, tokenizer_dir: str) -> dict[str, str]:
        """Write the stage's models as Hugging Face folders in the run folder; returns {"policy": dir, "critic": dir}."""
        paths = {}
        for name, engine in self.trainer.engines().items():
            path = Path(out_dir) / name
            export_hf(engine, self.storage.place(path), self.storage.fetch(tokenizer_dir) if name == "policy" else None)
            if self.rank == 0:
                self.storage.publish(path)
            paths[name] = str(path)
        return paths


class LearnerGroup:
    """The learner's ranks, called as one: every rank runs each call, rank 0 answers."""

    def __init__(self, cfg: Mapping[str, Any], slot_options: Sequence[dict[str, Any]], storage: RunStorage | None = None):
        self.cfg, self.slot_options, self.storage = cfg, list(slot_options), storage
        self.ranks: list[Any] = []
        self.sequence_parallel = int(cfg.get("learner", {}).get("sequence_parallel_size", 1))
        if self.sequence_parallel < 1 or self.world_size % self.sequence_parallel:
            raise ValueError(f"learner.sequence_parallel_size={self.sequence_parallel} must be at least 1 and divide the "
                             f"learner's {self.world_size} rank(s) (cluster.learner_gpus, or cluster.learner_cpu_ranks "
                             "on the CPU)")

    @property
    def world_size(self) -> int:
        return len(self.slot_options)

    async def start(self) -> None:
        """Create the ranks: rank 0 first, since the others need its address."""
        # Named, so that an operator (or a test) can find rank 0: ray.get_actor("cuda-agent-learner").
        names = ["cuda-agent-learner"] + [f"cuda-agent-learner-{r}" for r in range(1, self.world_size)]
        first = LearnerActor.options(name=names[0], max_restarts=0, **self.slot_options[0]).remote(
            self.cfg, 0, self.world_size, None, self.storage)
        master = await first.master_address.remote()
        self.ranks = [first] + [LearnerActor.options(name=names[r], max_restarts=0, **self.slot_options[r]).remote(
            self.cfg, r, self.world_size, master, self.storage) for r in range(1, self.world_size)]
        nodes = await asyncio.gather(*(r.node.remote() for r in self.ranks))
        await asyncio.gather(*(r.set_publisher.remote(nodes.index(n) == i) for i, (r, n) in enumerate(zip(self.ranks, nodes))))

    async def restart(self) -> None:
        """Replace every rank (a dead one broke the others' process group)."""
        self.kill()
        for rank in self.ranks:  # wait until each is gone, so its name and resources are free
            while True:
                try:
                    await rank.master_address.remote()
                except ray.exceptions.RayActorError:
                    break
                await asyncio.sleep(0.2)
        await self.start()

    def kill(self) -> None:
        for rank in self.ranks:
            ray.kill(rank, no_restart=True)

    async def call(self, method: str, *args: Any) -> Any:
        results = await asyncio.gather(*(getattr(r, method).remote(*args) for r in self.ranks))
        return results[0]

    async def step(self, refs: list[Any], sizes: list[int], weights: list[float], version: int = 0,
                   episode_advantages: list[float] | None = None) -> StepResult:
        """Each rank fetches its share of the batch (``rank_shares``) and trains on it. A trajectory
        lost with its generator is left out, and the rest dealt again (no rank may be left without
        one), or, with too few left for the ranks, nothing is trained. The metrics are rank 0's (its
        shares' means; the gradient norms are global), with the counts summed over the data-parallel
        groups. ``version`` and ``episode_advantages`` as in LearnerActor.step."""
        keep, lost = list(range(len(refs))), []
        while True:
            if len(keep) < self.world_size // self.sequence_parallel:
                return StepResult({}, sorted(lost))
            shares = [[keep[i] for i in share] for share in
                      rank_shares([sizes[i] for i in keep], self.world_size, self.sequence_parallel)]
            gone = await asyncio.gather(*(r.fetch.remote([refs[i] for i in share]) for r, share in zip(self.ranks, shares)))
            newly = {share[p] for share, positions in zip(shares, gone) for p in positions}
            if not newly:
                break
            lost += newly
            keep = [i for i in keep if i not in newly]
        adv = episode_advantages
        results = await asyncio.gather(*(r.step.remote([weights[i] for i in share], version,
                                                       None if adv is None else [adv[i] for i in share])
                                         for r, share in zip(self.ranks, shares)))
        firsts = results[::self.sequence_parallel]  # one rank per group: a group's ranks count the same rows
        counts = {k: sum(m.get(k, 0.0) for m in firsts) for k in SUMMED_METRICS if k in results[0]}
        return StepResult({**results[0], **counts}, sorted(lost))


@dataclass
class StepResult:
    """A learner step's answer: rank 0's metrics (empty when nothing was trained) and the batch
    positions whose trajectories were lost with their generator (not trained: run them again)."""

    metrics: dict[str, float]
    lost: list[int] = field(default_factory=list)


def rank_shares(sizes: list[int], world_size: int, sequence_parallel: int = 1) -> list[list[int]]:
    """Trajectory indices per rank: the batch dealt over the data-parallel groups, each group's
    share given to every one of its ``sequence_parallel`` consecutive ranks (they slice the same rows)."""
    shares = deal(sizes, world_size // sequence_parallel)
    return [shares[r // sequence_parallel] for r in range(world_size)]


def deal(sizes: list[int], ranks: int) -> list[list[int]]:
    """Trajectory indices per rank: longest first, each to the rank with the fewest tokens so far,
    so that ranks finish their step at about the same time. Every rank gets at least one."""
    if len(sizes) < ranks:
        raise ValueError(f"{len(sizes)} trajectories cannot feed {ranks} learner ranks: "
                         f"stage.batch_episodes must be at least the number of learner ranks")
    shares: list[list[int]] = [[] for _ in range(ranks)]
    load = [0] * ranks
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        r = min(range(ranks), key=lambda r: (len(shares[r]) > 0, load[r]))
        shares[r].append(i)
        load[r] += sizes[i]
    return [sorted(s) for s in shares]


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()
