"""Rejection fine-tuning: imitate the agent's own good episodes before agentic PPO.

The filter keeps an episode when it reached the reward threshold, its tool calls were mostly
well formed, and it did not loop (the paper drops inefficient loops and invalid tool calls,
so the actor does not learn to pad its way to success). The loss is the token-mean negative
log-likelihood of the model's own tokens only: prompts, tool output and template glue are
context, not targets.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from configs.schema import LearnerConfig, RFTConfig
from learner import engine as engines
from learner import sequence_parallel
from learner.batching import flatten, split_minibatches
from learner.losses import token_mean
from learner.models import load_policy, resolve_attention, resolve_dtype, row_tokens, score_tokens
from protocol.trajectory import Trajectory
from protocol.trajectory_meta import TrajectoryMeta


def rejection_reason(episode: TrajectoryMeta, cfg: RFTConfig) -> str | None:
    """Why an episode is not worth imitating, or None to keep it (from its meta: the driver
    filters before the learner fetches any tokens)."""
    if not episode.token_level or episode.num_generated == 0:
        return "no_tokens"
    if episode.stop_reason == "error":
        return "error"
    if episode.reward < cfg.reward_threshold:
        return "low_reward"
    if episode.invalid_call_rate > cfg.max_invalid_call_rate:
        return "invalid_calls"
    if episode.longest_repeat > cfg.max_repeated_actions:
        return "repeated_actions"
    return None


def filter_episodes(episodes: list[TrajectoryMeta], cfg: RFTConfig) -> tuple[list[TrajectoryMeta], Counter]:
    """The episodes to imitate, and how many were dropped for each reason."""
    kept, dropped = [], Counter()
    for episode in episodes:
        reason = rejection_reason(episode, cfg)
        if reason is None:
            kept.append(episode)
        else:
            dropped[reason] += 1
    return kept, dropped


class RFTTrainer:
    """Supervised steps of the policy on filtered trajectories."""

    def __init__(self, cfg: LearnerConfig, policy):
        self.cfg = cfg
        self.policy = policy
        self.steps = 0

    @classmethod
    def create(cls, cfg: LearnerConfig, policy_path: str | Path, dtype: str = "auto", total_steps: int = 100) -> "RFTTrainer":
        gpu = engines.on_gpu()
        torch_dtype, attention = resolve_dtype(dtype, gpu), resolve_attention(cfg.attn_implementation, gpu)
        engines.init_learner(cfg, policy_path, attention)
        with engines.zero3_init(cfg, bf16=torch_dtype == torch.bfloat16):
            module = load_policy(policy_path, torch_dtype, attention, cfg.grad_checkpointing)
        return cls(cfg, engines.build_engine(module, cfg, cfg.rft.lr, total_steps * cfg.ppo_minibatches))

    def engines(self) -> dict:
        return {"policy": self.policy}

    def state(self) -> dict:
        return {"steps": self.steps}

    def load_state(self, state: dict) -> None:
        self.steps = int(state["steps"])

    def step(self, trajectories: list[Trajectory], weights: list[float] | None = None) -> dict[str, float]:
        """One pass over already-filtered trajectories: ``ppo_minibatches`` optimiser steps.
        ``weights`` are the trajectories' loss weights in (0, 1] (None: all 1.0); ``nll`` is
        reported unweighted, as a measure of fit, while its gradient is weighted."""
        batch = flatten(trajectories, weights)
        micro = sequence_parallel.pack_rows(batch.sequences, row_tokens(self.cfg))
        dev = engines.device()
        token_weights = batch.weights.to(dev)
        total_nll = 0.0
        for group in split_minibatches(micro, self.cfg.ppo_minibatches):
            count = engines.loss_denominator(float(sum(mb.num_generated for mb in group)))
            for mb in group:
                mb = sequence_parallel.local_slice(mb).to(dev)
                logprobs, _ = score_tokens(self.policy, mb)
                # Over the plain token count, not the weights' sum: renormalising would train a
                # batch of only downweighted episodes as hard as a full-weight one.
                self.policy.backward(token_mean(-token_weights[mb.flat_index] * logprobs, count))
                total_nll += float(-logprobs.detach().sum())
            self.policy.step()
        self.steps += 1
        total_nll = sequence_parallel.reduce_sums({"nll": total_nll})["nll"]  # each rank summed its slices
        return {
            "nll": total_nll / batch.num_generated,
            "mean_loss_weight": float(batch.weights.mean()),
            "generated_tokens": float(batch.num_generated),
            "tokens": float(batch.num_tokens),
            "micro_batches": float(len(micro)),
            "lr": self.policy.get_lr()[0],
            "grad_norm_policy": float(self.policy.get_global_grad_norm() or float("nan")),
            "policy_trained": 1.0,  # every RFT step moves the policy: the driver advances its version
        }
