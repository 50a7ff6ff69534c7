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


LOOP_PERIODS = 4  # the longest cycle of turns looked for (A, B, A, B is a loop of period 2)


def invalid_call_rate(traj: Trajectory) -> float:
    """Malformed or unknown tool calls over the calls attempted (0 when it made none).

    A call that parsed but was refused counts once in each: it is in ``tools`` and in
    ``invalid_calls`` (one valid and one refused call once read 0.33, not 0.5)."""
    invalid = sum(t.invalid_calls for t in traj.turns)
    total = sum(t.calls or len(t.tools) for t in traj.turns)  # ``calls`` 0: a trajectory recorded before it was kept
    return min(1.0, invalid / total) if total else (1.0 if invalid else 0.0)


def longest_repeat(traj: Trajectory) -> int:
    """How many times in a row the episode repeated one action or one cycle of actions (up to
    LOOP_PERIODS turns long): 1 when nothing repeats. An action is the turn's generated text, or
    its tokens when no text was kept. A, A, A is 3; A, B, A, B, A, B is 3 too (a loop of two
    turns, which consecutive-turn equality alone never saw)."""
    actions = [turn.text.strip() if turn.text.strip() else tuple(traj.segments[turn.segment].token_ids[turn.start:turn.end])
               for turn in traj.turns]
    longest = 1 if actions else 0
    for period in range(1, LOOP_PERIODS + 1):
        run = 0  # consecutive turns equal to the one ``period`` before
        for k in range(period, len(actions)):
            run = run + 1 if actions[k] == actions[k - period] else 0
            longest = max(longest, 1 + run // period)
    return longest


def rejection_reason(traj: Trajectory, cfg: RFTConfig) -> str | None:
    """Why an episode is not worth imitating, or None to keep it."""
    if not traj.token_level or traj.num_generated == 0:
        return "no_tokens"
    if traj.stop_reason == "error":
        return "error"
    if traj.reward < cfg.reward_threshold:
        return "low_reward"
    if invalid_call_rate(traj) > cfg.max_invalid_call_rate:
        return "invalid_calls"
    if longest_repeat(traj) > cfg.max_repeated_actions:
        return "repeated_actions"
    return None


def filter_trajectories(trajectories: list[Trajectory], cfg: RFTConfig) -> tuple[list[Trajectory], Counter]:
    """The episodes to imitate, and how many were dropped for each reason."""
    kept, dropped = [], Counter()
    for traj in trajectories:
        reason = rejection_reason(traj, cfg)
        if reason is None:
            kept.append(traj)
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
