"""One PPO learner step over a batch of trajectories.

    score:       old values (critic), reference logprobs (if kl_coef), proximal logprobs for
                 tokens from older policy versions (see losses.py)
    advantages:  per-token rewards (episode reward last, optional per-turn rewards, optional KL
                 penalty), GAE over each trajectory's generated tokens, whitened over the batch
    update:      ppo_epochs passes; each pass splits the micro-batches into ppo_minibatches
                 groups, and each group is one optimiser step of the policy and one of the critic

Single-turn episodes are the same code with one turn. Until ``critic_warmup_steps`` learner
steps have passed, only the critic trains (the policy, and its version, stay put).

Loss weights: the buffer may serve a stale trajectory downweighted (stage.stale_policy); each
of its tokens' losses (policy, KL, entropy and value terms) is multiplied by that weight before
the token mean, whose denominator stays the plain generated-token count. Dividing by the sum
of the weights instead would renormalise them away: a batch of only downweighted trajectories
would then train as hard as a fresh one, which is what downweighting is meant to prevent.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from configs.schema import KLMode, LearnerConfig
from learner import engine as engines
from learner.batching import FlatBatch, MicroBatch, flatten, pack, split_minibatches
from learner.gae import batch_advantages, explained_variance, whiten
from learner.losses import kl_k3, kl_penalty, policy_loss, token_mean, value_loss
from learner.models import (Critic, critic_values, load_policy, load_reference, resolve_attention, resolve_dtype, row_tokens,
                            score_batch, score_tokens)
from rollout.trajectory import Trajectory


@dataclass
class TokenData:
    """Per generated token of the batch, flat order, on the learner's device."""

    behaviour: torch.Tensor
    weights: torch.Tensor  # loss weight (see the module doc)
    prox: torch.Tensor
    ref: torch.Tensor | None
    old_values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor


class Sums:
    """Token-weighted sums of step metrics, divided out at the end."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, float] = {}

    def add(self, name: str, per_token: torch.Tensor) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + float(per_token.detach().float().sum())
        self.counts[name] = self.counts.get(name, 0.0) + per_token.numel()

    def means(self) -> dict[str, float]:
        return {k: v / max(self.counts[k], 1.0) for k, v in self.sums.items()}


def update_critic(critic, group: list[MicroBatch], count: float, old_values: torch.Tensor, returns: torch.Tensor,
                  weights: torch.Tensor, value_clip: float, sums: Sums) -> None:
    """One optimiser step of the critic over a group of micro-batches (token-mean of the
    weighted value loss, over the plain token count: see the module doc)."""
    dev = engines.device()
    for mb in group:
        mb = mb.to(dev)
        idx = mb.flat_index
        values = critic_values(critic, mb)
        loss_tok, clipped = value_loss(values, old_values[idx], returns[idx], value_clip)
        loss_tok = weights[idx] * loss_tok
        critic.backward(token_mean(loss_tok, count))
        sums.add("value_loss", loss_tok)
        sums.add("value_clip_frac", clipped)
    critic.step()


class PPOTrainer:
    """The policy and critic engines, an optional frozen reference, and the PPO step."""

    def __init__(self, cfg: LearnerConfig, policy, critic, reference=None, version: int = 0):
        self.cfg = cfg
        self.policy = policy
        self.critic = critic
        self.reference = reference
        self.version = version  # policy version of the current weights
        self.steps = 0  # learner steps taken (critic-only warm-up steps included)
        if cfg.kl_coef > 0 and reference is None:
            raise ValueError("learner.kl_coef > 0 needs a reference model; pass one, or set kl_coef=0")

    @classmethod
    def create(cls, cfg: LearnerConfig, policy_path: str | Path, critic_path: str | Path | None = None,
               dtype: str = "auto", total_steps: int = 100) -> "PPOTrainer":
        """Load the models and wrap them in engines; ``total_steps`` learner steps shape the LR schedule."""
        engines.init_distributed()
        gpu = engines.on_gpu()
        torch_dtype, attention = resolve_dtype(dtype, gpu), resolve_attention(cfg.attn_implementation, gpu)
        optimiser_steps = total_steps * cfg.ppo_epochs * cfg.ppo_minibatches
        with engines.zero3_init(cfg, bf16=torch_dtype == torch.bfloat16):
            policy_module = load_policy(policy_path, torch_dtype, attention, cfg.grad_checkpointing)
            critic_module = Critic.from_pretrained(critic_path or policy_path, torch_dtype, attention, cfg.grad_checkpointing)
        policy = engines.build_engine(policy_module, cfg, cfg.lr, optimiser_steps)
        critic = engines.build_engine(critic_module, cfg, cfg.critic_lr, optimiser_steps)
        reference = None
        if cfg.kl_coef > 0:  # a full frozen copy on each rank (outside zero3_init: it runs without an engine)
            reference = load_reference(policy_path, torch_dtype, attention).to(engines.device())
        return cls(cfg, policy, critic, reference)

    def engines(self) -> dict:
        return {"policy": self.policy, "critic": self.critic}

    def state(self) -> dict:
        return {"version": self.version, "steps": self.steps}

    def load_state(self, state: dict) -> None:
        self.version, self.steps = int(state["version"]), int(state["steps"])

    # -- the step ---------------------------------------------------------------------

    def step(self, trajectories: list[Trajectory], weights: list[float] | None = None) -> dict[str, float]:
        """Train on one batch; ``weights`` are the trajectories' loss weights in (0, 1] (None: all
        1.0). Returns metrics (token means unless named otherwise; losses as weighted)."""
        cfg = self.cfg
        batch = flatten(trajectories, weights)
        micro = pack(batch.sequences, row_tokens(cfg))
        data = self._prepare(batch, micro)
        train_policy = self.steps >= cfg.critic_warmup_steps
        stale_fraction = float((batch.versions < self.version).float().mean())
        sums = Sums()
        for _ in range(cfg.ppo_epochs):
            for group in split_minibatches(micro, cfg.ppo_minibatches):
                count = engines.loss_denominator(float(sum(mb.num_generated for mb in group)))
                if train_policy:
                    self._update_policy(group, count, data, sums)
                update_critic(self.critic, group, count, data.old_values, data.returns, data.weights, cfg.value_clip,
                              sums)
        self.steps += 1
        if train_policy:
            self.version += 1
        metrics = sums.means()
        metrics.update(
            reward_mean=sum(batch.rewards) / len(batch.rewards),
            explained_variance=explained_variance(data.old_values.cpu(), data.returns.cpu()),
            return_mean=float(data.returns.mean()),
            value_mean=float(data.old_values.mean()),
            stale_fraction=stale_fraction,
            mean_loss_weight=float(batch.weights.mean()),
            grad_norm_critic=_grad_norm(self.critic),
            lr=self.policy.get_lr()[0],
            critic_lr=self.critic.get_lr()[0],
            tokens=float(batch.num_tokens),
            generated_tokens=float(batch.num_generated),
            micro_batches=float(len(micro)),
            policy_trained=float(train_policy),
            version=float(self.version),
        )
        if train_policy:
            metrics["grad_norm_policy"] = _grad_norm(self.policy)
        return metrics

    def _prepare(self, batch: FlatBatch, micro: list[MicroBatch]) -> TokenData:
        cfg, dev, n = self.cfg, engines.device(), batch.num_generated
        old_values = score_batch(self.critic, micro, n, critic=True, device=dev)
        ref = score_batch(self.reference, micro, n, critic=False, device=dev) if self.reference is not None else None
        behaviour = batch.behaviour_logprobs
        prox = behaviour
        stale = batch.versions < self.version
        if bool(stale.any()):
            current = score_batch(self.policy, micro, n, critic=False, device=dev)
            prox = torch.where(stale, current, behaviour)
        bonus = None
        if ref is not None and cfg.kl_mode == KLMode.penalty:
            bonus = kl_penalty(behaviour, ref, cfg.kl_coef)
        advantages, returns = batch_advantages(batch, old_values, cfg.gamma, cfg.gae_lambda, cfg.per_turn_rewards, bonus)
        if cfg.whiten_advantages:
            advantages = whiten(advantages)
        to = lambda t: None if t is None else t.to(dev)  # noqa: E731
        return TokenData(to(behaviour), to(batch.weights), to(prox), to(ref), to(old_values), to(advantages), to(returns))

    def _update_policy(self, group: list[MicroBatch], count: float, data: TokenData, sums: Sums) -> None:
        cfg, dev = self.cfg, engines.device()
        kl_loss = data.ref is not None and cfg.kl_mode == KLMode.loss
        for mb in group:
            mb = mb.to(dev)
            idx = mb.flat_index
            logprobs, entropy = score_tokens(self.policy, mb, with_entropy=True, entropy_grad=cfg.entropy_coef > 0)
            weight = data.weights[idx]
            loss_tok, info = policy_loss(logprobs, data.prox[idx], data.behaviour[idx], data.advantages[idx],
                                         cfg.clip_ratio, cfg.importance_cap)
            sums.add("policy_loss", weight * loss_tok)
            if kl_loss:
                kl = kl_k3(logprobs, data.ref[idx])
                loss_tok = loss_tok + cfg.kl_coef * kl
                sums.add("kl_ref", kl)
            elif data.ref is not None:
                sums.add("kl_ref", kl_k3(logprobs.detach(), data.ref[idx]))
            if cfg.entropy_coef > 0:
                loss_tok = loss_tok - cfg.entropy_coef * entropy
            # Regularisers included: weighting only the surrogate would tip a downweighted token's
            # balance toward the KL and entropy terms, away from what kl_coef and entropy_coef were tuned for.
            self.policy.backward(token_mean(weight * loss_tok, count))
            sums.add("entropy", entropy)
            sums.add("clip_frac", info["clipped"])
            sums.add("approx_kl", info["approx_kl"])
            sums.add("importance_weight", info["importance_weight"])
        self.policy.step()


def _grad_norm(engine) -> float:
    norm = engine.get_global_grad_norm()
    return float(norm) if norm is not None else float("nan")
