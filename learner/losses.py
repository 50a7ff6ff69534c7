"""PPO's loss terms, per generated token, and their aggregation.

Every function returns one value per generated token; ``token_mean`` turns a per-token loss
into the scalar to back-propagate. Token-mean aggregation: every generated token of the
optimiser step weighs the same, whichever trajectory it belongs to. A per-sequence mean would
give a 40-token reply the weight of a 40,000-token agentic episode, so the long episodes that
the paper trains on would barely move the policy; a per-sequence sum would make the step size
grow with length. The denominator is the number of generated tokens in the whole optimiser
step (all micro-batches, all data-parallel ranks), not in one micro-batch, so packing and
sharding change nothing.

Off-policy correction (decoupled PPO, Hilton et al. 2022, with a truncated importance weight):

    loss_t = -min(pi_prox / mu, cap) * min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t),
    r_t = pi_theta / pi_prox

mu is the behaviour policy (the sampler's logprob). pi_prox is the policy the trust region is
drawn around: the learner's own scoring of every token at the start of the step (ppo.py), so
r_t is exactly 1 on the step's first minibatch. It is not mu even for tokens of the current
version: in bf16 the sampler's kernels and the learner's disagree, and a ratio taken against
mu would start away from 1 and clip tokens before any update. The weight pi_prox / mu corrects
for the sampler (a stale version, or only its numerics), truncated at ``cap`` so that one
unlikely token cannot dominate the step.

eps_high above eps_low is "clip-higher" (DAPO, Yu et al. 2025; the CUDA Agent paper's 0.2 /
0.28): a low-probability token with a positive advantage may grow further before it is
clipped, which keeps the policy's entropy from collapsing.
"""
from __future__ import annotations

import torch


def policy_loss(logprobs: torch.Tensor, prox_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor,
                advantages: torch.Tensor, clip_ratio: float, importance_cap: float,
                clip_ratio_high: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token clipped surrogate with the truncated behaviour importance weight (see module doc);
    ``clip_ratio`` is eps_low, ``clip_ratio_high`` eps_high (None: the same as eps_low)."""
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    ratio = torch.exp(logprobs - prox_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + high)
    weight = torch.exp(prox_logprobs - behaviour_logprobs).clamp(max=importance_cap).detach()
    loss = weight * torch.maximum(unclipped, clipped)
    info = {
        "clipped": (clipped > unclipped).float().detach(),
        "ratio": ratio.detach(),
        "importance_weight": weight,
        # k3 estimate of KL(prox || theta): non-negative, low variance
        "approx_kl": ((ratio - 1.0) - torch.log(ratio)).detach(),
    }
    return loss, info


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped value loss, 0.5 * max((V - R)^2, (V_old + clip(V - V_old) - R)^2), and
    whether the clipped branch was taken. ``clip <= 0`` turns clipping off."""
    unclipped = (values - returns) ** 2
    if clip <= 0:
        return 0.5 * unclipped, torch.zeros_like(unclipped)
    clipped_values = old_values + torch.clamp(values - old_values, -clip, clip)
    clipped = (clipped_values - returns) ** 2
    return 0.5 * torch.maximum(unclipped, clipped), (clipped > unclipped).float().detach()


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi_theta || pi_ref) on samples from pi_theta: exp(d) - d - 1,
    d = ref - theta. Non-negative and unbiased, with a gradient that pulls toward the reference."""
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1.0


def kl_penalty(behaviour_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, coef: float) -> torch.Tensor:
    """Per-token reward penalty -coef * (log mu - log pi_ref) (the k1 estimator, in the reward)."""
    return -coef * (behaviour_logprobs - ref_logprobs)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of each row's softmax, in nats."""
    logits = logits.float()
    log_z = torch.logsumexp(logits, dim=-1)
    return log_z - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)


def token_mean(per_token: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Sum of this micro-batch's per-token losses over the optimiser step's generated-token count."""
    if num_tokens <= 0:
        raise ValueError("token_mean needs the optimiser step's generated-token count, got 0")
    return per_token.sum() / num_tokens
