"""LearnerActor: the DeepSpeed engines of one training stage, behind a Ray actor.

One actor is one learner rank. The driver builds the trainer a stage needs (PPO with a critic,
RFT, or value pretraining), feeds it batches of trajectories from the object store, asks for
the policy's weights as object-store buckets after each step (the CPU weight-sync path), and
has it checkpoint. A stage ends by exporting its models as Hugging Face folders, which the
next stage starts from: the recipe's hand-offs (RFT's policy into PPO, value pretraining's
critic into PPO) are plain folders a person can load, not state hidden in a process.
"""
from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any, Mapping

import ray
from omegaconf import OmegaConf

from configs.schema import Config
from learner.checkpoint import export_hf, load_checkpoint, save_checkpoint
from learner.weights import iter_weight_buckets

TRAINERS = ("ppo", "rft", "value")


def _trainer(kind: str, cfg: Any, policy_path: str, critic_path: str | None, total_steps: int):
    dtype = cfg.model.dtype
    if kind == "ppo":
        from learner.ppo import PPOTrainer

        return PPOTrainer.create(cfg.learner, policy_path, critic_path, dtype=dtype, total_steps=total_steps)
    if kind == "rft":
        from learner.rft import RFTTrainer

        return RFTTrainer.create(cfg.learner, policy_path, dtype=dtype, total_steps=total_steps)
    if kind == "value":
        from learner.value_pretrain import ValuePretrainer

        return ValuePretrainer.create(cfg.learner, critic_path or policy_path, dtype=dtype, total_steps=total_steps)
    raise ValueError(f"trainer kind must be one of {TRAINERS}, got {kind!r}")


@ray.remote
class LearnerActor:
    def __init__(self, cfg: Mapping[str, Any]):
        os.environ.setdefault("DS_ACCELERATOR", "cpu" if not _has_gpu() else "cuda")
        self.cfg = OmegaConf.merge(OmegaConf.structured(Config), cfg)
        self.trainer = None
        self.kind = ""
        self.checkpoints = Path()

    def setup(self, kind: str, stage_dir: str, policy_path: str, critic_path: str | None, total_steps: int) -> dict[str, Any]:
        """Build the stage's trainer and resume it from the stage's latest checkpoint, if any."""
        self.kind = kind
        self.trainer = None  # the previous stage's engines go before this stage's are built
        gc.collect()
        self.trainer = _trainer(kind, self.cfg, policy_path, critic_path, total_steps)
        self.checkpoints = Path(stage_dir) / "checkpoints"
        state = load_checkpoint(self.checkpoints, self.trainer.engines())
        if state is not None:
            self.trainer.load_state(state["trainer"])
        return state or {}

    def step(self, batch: list[Any]) -> dict[str, float]:
        """One learner step on trajectories; ``batch`` holds their object refs (nested, so unresolved)."""
        return self.trainer.step(ray.get(batch))

    def version(self) -> int:
        return getattr(self.trainer, "version", 0)

    def save(self, step: int, extra: dict[str, Any]) -> str:
        state = {"trainer": self.trainer.state(), **extra}
        return str(save_checkpoint(self.checkpoints, step, self.trainer.engines(), state))

    def export_weights(self, bucket_mb: int = 512) -> list[Any]:
        """The policy's weights as object-store buckets of (name, tensor) pairs, for the generators."""
        policy = self.trainer.engines()["policy"]
        return [ray.put([(n, t.detach().cpu().clone()) for n, t in bucket])
                for bucket in iter_weight_buckets(policy, bucket_mb * 2**20)]

    def export(self, out_dir: str, tokenizer_dir: str) -> dict[str, str]:
        """Write the stage's models as Hugging Face folders; returns {"policy": dir, "critic": dir}."""
        paths = {}
        for name, engine in self.trainer.engines().items():
            path = Path(out_dir) / name
            export_hf(engine, path, tokenizer_dir if name == "policy" else None)
            paths[name] = str(path)
        return paths


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()
