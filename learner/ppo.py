"""One PPO learner step over a batch of trajectories.

    score:       old values (critic), reference logprobs (if kl_coef), proximal logprobs: the
                 policy's own scoring of every token at the step's start (see losses.py)
    advantages:  per-token rewards (episode reward last, optional per-turn progress credits,
                 optional KL penalty), GAE over each trajectory's generated tokens, whitened
                 over the batch; or (learner.advantage=grpo) each episode's group-relative
                 advantage on all its tokens, computed by the caller over whole groups (groups.py)
    update:      ppo_epochs passes; each pass splits the micro-batches into ppo_minibatches
                 groups, and each group is one optimiser step of the policy and one of the critic

Single-turn episodes are the same code with one turn. Until ``critic_warmup_steps`` learner
steps have passed, only the critic trains (the policy stays put; ``policy_trained`` says so).

The policy version is not the trainer's to count: the driver owns it (actors/system.py), passes
the version of the weights this trainer holds into every step, and advances it when a step
reports ``policy_trained``. A trainer built for a new stage starts from weights that already
carry a version (the generators served them), so a count of its own from 0 would call stale
tokens fresh and skip their correction.

The value clip is a fraction of the reward span (``reward_span``: top milestone minus failure),
so it means the same on any reward schedule: 0.2 lets a value move 0.8 per step on the default
-1..3 rewards, where a clip of 0.2 reward units would hold a fresh critic back for many steps.

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

from configs.schema import AdvantageEstimator, KLMode, LearnerConfig
from learner import engine as engines
from learner.batching import FlatBatch, MicroBatch, flatten, split_minibatches
from learner.gae import batch_advantages, explained_variance, whiten
from learner.losses import kl_k3, kl_penalty, policy_loss, token_mean, value_loss
from learner.models import (Critic, critic_values, load_policy, load_reference, resolve_attention, resolve_dtype, row_tokens,
                            score_batch, score_tokens)
from learner.sequence_parallel import local_slice, pack_rows, reduce_sums
from protocol.trajectory import Trajectory


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
        """The means over this rank's rows (under sequence parallelism, over all the group's slices of them)."""
        sums, counts = reduce_sums(self.sums), reduce_sums(self.counts)
        return {k: v / max(counts[k], 1.0) for k, v in sums.items()}


def update_critic(critic, group: list[MicroBatch], count: float, old_values: torch.Tensor, returns: torch.Tensor,
                  weights: torch.Tensor, value_clip: float, sums: Sums) -> None:
    """One optimiser step of the critic over a group of micro-batches (token-mean of the
    weighted value loss, over the plain token count: see the module doc)."""
    dev = engines.device()
    for mb in group:
        mb = local_slice(mb).to(dev)
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

    def __init__(self, cfg: LearnerConfig, policy, critic, reference=None, reward_span: float = 4.0):
        self.cfg = cfg
        self.policy = policy
        self.critic = critic
        self.reference = reference
        self.reward_span = reward_span  # top milestone reward minus the failure reward (env.reward)
        self.steps = 0  # learner steps taken (critic-only warm-up steps included)
        if cfg.kl_coef > 0 and reference is None:
            raise ValueError("learner.kl_coef > 0 needs a reference model; pass one, or set kl_coef=0")
        if not reward_span > 0:
            raise ValueError(f"reward_span must be positive (top milestone reward minus failure), got {reward_span}")
        if _advantage(cfg) == AdvantageEstimator.grpo and cfg.kl_coef > 0 and cfg.kl_mode == KLMode.penalty:
            # The group-relative advantage is computed from episode rewards before the step: a
            # per-token penalty in the reward would never reach it.
            raise ValueError("learner.advantage=grpo ignores a KL penalty in the reward: set learner.kl_mode=loss")

    @classmethod
    def create(cls, cfg: LearnerConfig, policy_path: str | Path, critic_path: str | Path | None = None,
               dtype: str = "auto", total_steps: int = 100, reward_span: float = 4.0) -> "PPOTrainer":
        """Load the models and wrap them in engines; ``total_steps`` learner steps shape the LR
        schedule; ``reward_span`` scales the value clip (the default is the default rewards')."""
        gpu = engines.on_gpu()
        torch_dtype, attention = resolve_dtype(dtype, gpu), resolve_attention(cfg.attn_implementation, gpu)
        engines.init_learner(cfg, policy_path, attention)
        optimiser_steps = total_steps * cfg.ppo_epochs * cfg.ppo_minibatches
        with engines.zero3_init(cfg, bf16=torch_dtype == torch.bfloat16):
            policy_module = load_policy(policy_path, torch_dtype, attention, cfg.grad_checkpointing)
            critic_module = Critic.from_pretrained(critic_path or policy_path, torch_dtype, attention, cfg.grad_checkpointing)
        policy = engines.build_engine(policy_module, cfg, cfg.lr, optimiser_steps)
        critic = engines.build_engine(critic_module, cfg, cfg.critic_lr, optimiser_steps)
        reference = None
        if cfg.kl_coef > 0:  # a full frozen copy on each rank (outside zero3_init: it runs without an engine)
            reference = load_reference(policy_path, torch_dtype, attention).to(engines.device())
        return cls(cfg, policy, critic, reference, reward_span)

    def engines(self) -> dict:
        return {"policy": self.policy, "critic": self.critic}

    def state(self) -> dict:
        return {"steps": self.steps}

    def load_state(self, state: dict) -> None:
        self.steps = int(state["steps"])

    # -- the step ---------------------------------------------------------------------

    def step(self, trajectories: list[Trajectory], weights: list[float] | None = None, *, version: int,
             episode_advantages: list[float] | None = None) -> dict[str, float]:
        """Train on one batch; ``weights`` are the trajectories' loss weights in (0, 1] (None: all
        1.0); ``version`` is the policy version of the weights this trainer holds, as the driver
        (its owner) says: tokens of older versions are stale. ``episode_advantages``, one per
        trajectory, are needed with learner.advantage=grpo (groups.py). Returns metrics (token
        means unless named otherwise; losses as weighted); ``policy_trained`` 1.0 means the
        policy changed, and its version must advance."""
        cfg = self.cfg
        batch = flatten(trajectories, weights)
        micro = pack_rows(batch.sequences, row_tokens(cfg))
        data = self._prepare(batch, micro, version, episode_advantages)
        train_policy = self.steps >= cfg.critic_warmup_steps
        stale_fraction = float((batch.versions < version).float().mean())
        sums = Sums()
        for _ in range(cfg.ppo_epochs):
            for group in split_minibatches(micro, cfg.ppo_minibatches):
                count = engines.loss_denominator(float(sum(mb.num_generated for mb in group)))
                if train_policy:
                    self._update_policy(group, count, data, sums)
                update_critic(self.critic, group, count, data.old_values, data.returns, data.weights,
                              cfg.value_clip * self.reward_span, sums)
        self.steps += 1
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
            version=float(version),
        )
        if train_policy:
            metrics["grad_norm_policy"] = _grad_norm(self.policy)
        return metrics

    def _prepare(self, batch: FlatBatch, micro: list[MicroBatch], version: int,
                 episode_advantages: list[float] | None) -> TokenData:
        cfg, dev, n = self.cfg, engines.device(), batch.num_generated
        old_values = score_batch(self.critic, micro, n, critic=True, device=dev)
        ref = score_batch(self.reference, micro, n, critic=False, device=dev) if self.reference is not None else None
        behaviour = batch.behaviour_logprobs
        prox = behaviour
        stale = batch.versions < version
        if cfg.prox_from_learner or bool(stale.any()):
            current = score_batch(self.policy, micro, n, critic=False, device=dev)
            prox = current if cfg.prox_from_learner else torch.where(stale, current, behaviour)
        bonus = None
        if ref is not None and cfg.kl_mode == KLMode.penalty:
            bonus = kl_penalty(behaviour, ref, cfg.kl_coef)
        advantages, returns = batch_advantages(batch, old_values, cfg.gamma, cfg.gae_lambda, cfg.per_turn_rewards, bonus)
        if _advantage(cfg) == AdvantageEstimator.grpo:
            # The critic still learns the returns (for monitoring, and for a later switch to GAE);
            # the policy's advantages are the group's verdict, already normalised per group.
            advantages = episode_token_advantages(batch, episode_advantages)
        elif cfg.whiten_advantages:
            advantages = whiten(advantages)
        to = lambda t: None if t is None else t.to(dev)  # noqa: E731
        return TokenData(to(behaviour), to(batch.weights), to(prox), to(ref), to(old_values), to(advantages), to(returns))

    def _update_policy(self, group: list[MicroBatch], count: float, data: TokenData, sums: Sums) -> None:
        cfg, dev = self.cfg, engines.device()
        kl_loss = data.ref is not None and cfg.kl_mode == KLMode.loss
        for mb in group:
            mb = local_slice(mb).to(dev)
            idx = mb.flat_index
            logprobs, entropy = score_tokens(self.policy, mb, with_entropy=True, entropy_grad=cfg.entropy_coef > 0)
            weight = data.weights[idx]
            loss_tok, info = policy_loss(logprobs, data.prox[idx], data.behaviour[idx], data.advantages[idx],
                                         cfg.clip_ratio, cfg.importance_cap, cfg.clip_ratio_high)
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


def _advantage(cfg: LearnerConfig) -> AdvantageEstimator:
    return AdvantageEstimator(cfg.advantage)


def episode_token_advantages(batch: FlatBatch, episode_advantages: list[float] | None) -> torch.Tensor:
    """One advantage per trajectory spread over its generated tokens, in the flat order."""
    if episode_advantages is None or len(episode_advantages) != len(batch.spans):
        got = "none" if episode_advantages is None else len(episode_advantages)
        raise ValueError(f"learner.advantage=grpo needs one group-relative advantage per trajectory "
                         f"({len(batch.spans)}), got {got}: the driver computes them over whole groups (learner/groups.py)")
    out = torch.zeros(batch.num_generated, dtype=torch.float32)
    for (start, end), adv in zip(batch.spans, episode_advantages):
        out[start:end] = float(adv)
    return out


def _grad_norm(engine) -> float:
    norm = engine.get_global_grad_norm()
    return float(norm) if norm is not None else float("nan")
