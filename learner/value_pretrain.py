"""Critic value pretraining: fit the critic to a fixed policy's returns before PPO.

A fresh value head makes PPO's first advantages mostly noise, and the policy would move on
that noise; the paper therefore trains the critic alone on trajectories of the (frozen)
RFT policy first. Targets are the lambda-returns with value pretraining's own lambda
(``value_lambda``, 1 by default: the plain Monte Carlo returns), not PPO's: with the paper's
GAE lambda of 0.95 the target bootstraps from the critic being trained, and at the first token
of a 2,000-token episode that earned 3 it was 3 x 0.95^2000, about 1e-44, from a fresh critic.
Explained variance on each batch is measured before that batch's update, so it shows how well
the critic predicts returns it has not yet fitted.
"""
from __future__ import annotations

from pathlib import Path

import torch

from configs.schema import LearnerConfig
from learner import engine as engines
from learner.batching import flatten, split_minibatches
from learner.gae import batch_advantages, explained_variance
from learner.models import Critic, resolve_attention, resolve_dtype, row_tokens, score_batch
from learner.ppo import Sums, update_critic
from learner.sequence_parallel import pack_rows
from protocol.trajectory import Trajectory


def value_targets(batch, old_values: torch.Tensor, cfg: LearnerConfig) -> torch.Tensor:
    """The critic's targets for ``batch``: lambda-returns with ``cfg.value_lambda`` (not PPO's gae_lambda)."""
    return batch_advantages(batch, old_values, cfg.gamma, cfg.value_lambda, cfg.per_turn_rewards)[1]


class ValuePretrainer:
    def __init__(self, cfg: LearnerConfig, critic):
        self.cfg = cfg
        self.critic = critic
        self.steps = 0

    @classmethod
    def create(cls, cfg: LearnerConfig, critic_path: str | Path, dtype: str = "auto", total_steps: int = 100) -> "ValuePretrainer":
        gpu = engines.on_gpu()
        torch_dtype, attention = resolve_dtype(dtype, gpu), resolve_attention(cfg.attn_implementation, gpu)
        engines.init_learner(cfg, critic_path, attention)
        with engines.zero3_init(cfg, bf16=torch_dtype == torch.bfloat16):
            module = Critic.from_pretrained(critic_path, torch_dtype, attention, cfg.grad_checkpointing)
        return cls(cfg, engines.build_engine(module, cfg, cfg.critic_lr, total_steps * cfg.ppo_epochs * cfg.ppo_minibatches))

    def engines(self) -> dict:
        return {"critic": self.critic}

    def state(self) -> dict:
        return {"steps": self.steps}

    def load_state(self, state: dict) -> None:
        self.steps = int(state["steps"])

    def step(self, trajectories: list[Trajectory], weights: list[float] | None = None) -> dict[str, float]:
        """``weights`` are the trajectories' loss weights in (0, 1] (None: all 1.0), applied as in PPO."""
        cfg = self.cfg
        batch = flatten(trajectories, weights)
        micro = pack_rows(batch.sequences, row_tokens(cfg))
        dev = engines.device()
        old_values = score_batch(self.critic, micro, batch.num_generated, critic=True, device=dev)
        returns = value_targets(batch, old_values, cfg)
        sums = Sums()
        for _ in range(cfg.ppo_epochs):
            for group in split_minibatches(micro, cfg.ppo_minibatches):
                count = engines.loss_denominator(float(sum(mb.num_generated for mb in group)))
                # No value clipping here: pretraining should fit the returns, not stay near a random head.
                update_critic(self.critic, group, count, old_values.to(dev), returns.to(dev), batch.weights.to(dev),
                              0.0, sums)
        self.steps += 1
        metrics = sums.means()
        metrics.update(
            explained_variance=explained_variance(old_values, returns),
            return_mean=float(returns.mean()),
            value_mean=float(old_values.mean()),
            mean_loss_weight=float(batch.weights.mean()),
            critic_lr=self.critic.get_lr()[0],
            tokens=float(batch.num_tokens),
            generated_tokens=float(batch.num_generated),
            micro_batches=float(len(micro)),
            policy_trained=0.0,  # the policy is fixed here: its version stays
        )
        return metrics
