"""Per-token rewards and generalised advantage estimation over a trajectory's generated tokens.

A trajectory is one decision sequence: its generated tokens in order, across turns and
segments. Prompts, tool output and template glue are the environment's transition between
decisions, not decisions, so they get no time step: gamma and lambda discount per generated
token, and the value of a generated token's state is read at the position that predicts it.
The episode ends at its last generated token (next value 0), whatever stopped it: the final,
protected evaluation scored the work as it stood.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def token_rewards(num_tokens: int, final_reward: float, turn_ends: list[int], turn_rewards: list[float],
                  per_turn: bool) -> torch.Tensor:
    """Rewards of one trajectory's generated tokens: the episode reward (the outcome) on the last
    token and, with ``per_turn``, progress credits on the turns that reached a new best milestone.

    Progress credit: a turn whose evaluation beats the best milestone reward reached so far earns
    the difference, on its last token; the last token then gets the outcome minus the best
    reached. This is potential-based shaping (Ng et al. 1999) with the best-so-far as the
    potential, so the credits of an episode sum to its outcome whatever the turns did. Calling
    ``profile`` again on a solution that already reached its milestone earns nothing (the best
    did not rise), and a milestone reached and then broken is paid back at the end. The best
    starts at 0, the reward of a turn that evaluated nothing, so failed evaluations (below 0)
    earn no credit and cost none: the outcome alone judges them.
    """
    rewards = torch.zeros(num_tokens, dtype=torch.float32)
    if num_tokens == 0:
        return rewards
    best = 0.0
    if per_turn:
        for end, reward in zip(turn_ends, turn_rewards):
            if reward > best:
                # A turn that generated nothing credits the token before it (the decision that led there).
                rewards[max(end - 1, 0)] += reward - best
                best = reward
    rewards[-1] += final_reward - best
    return rewards


def gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns (advantage + value) of one trajectory, terminal after the last token.

    delta_t = r_t + gamma * V_{t+1} - V_t,  A_t = delta_t + gamma * lam * A_{t+1},  V_{n} = 0.
    """
    if rewards.shape != values.shape or rewards.dim() != 1:
        raise ValueError(f"rewards and values must be 1-D and the same length, got {tuple(rewards.shape)} and {tuple(values.shape)}")
    r, v = rewards.double().tolist(), values.double().tolist()
    advantages = [0.0] * len(r)
    running = next_value = 0.0
    # Plain floats: an agentic trajectory has up to ~100k generated tokens, and a per-element
    # tensor loop would cost seconds per batch.
    for t in range(len(r) - 1, -1, -1):
        running = r[t] + gamma * next_value - v[t] + gamma * lam * running
        advantages[t] = running
        next_value = v[t]
    adv = torch.tensor(advantages, dtype=torch.float64)
    return adv.float(), (adv + values.double()).float()


def whiten(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Zero mean, unit variance over every generated token of the batch, on all data-parallel ranks."""
    stats = torch.stack([x.sum(), (x * x).sum(), torch.tensor(float(x.numel()), dtype=x.dtype, device=x.device)]).double()
    if dist.is_initialized() and dist.get_world_size() > 1:
        on_nccl = dist.get_backend() == "nccl"  # NCCL reduces device tensors only
        stats = stats.cuda() if on_nccl else stats
        dist.all_reduce(stats)
        stats = stats.cpu()
    total, total_sq, count = stats.tolist()
    mean = total / max(count, 1.0)
    var = max(total_sq / max(count, 1.0) - mean * mean, 0.0)
    return ((x - mean) / (var + eps) ** 0.5).to(x.dtype)


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns): 1 is a perfect critic, 0 predicts only the mean."""
    var = returns.float().var(unbiased=False)
    if var <= 0:
        return float("nan")
    return float(1.0 - (returns.float() - values.float()).var(unbiased=False) / var)


def batch_advantages(batch, values: torch.Tensor, gamma: float, lam: float, per_turn: bool,
                     token_bonus: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns of every generated token of a ``batching.FlatBatch``, trajectory by
    trajectory, in its flat order. ``token_bonus`` adds a per-token reward (the KL penalty)."""
    advantages = torch.zeros_like(values, dtype=torch.float32)
    returns = torch.zeros_like(values, dtype=torch.float32)
    for k, (start, end) in enumerate(batch.spans):
        rewards = token_rewards(end - start, batch.rewards[k], batch.turn_ends[k], batch.turn_rewards[k], per_turn)
        if token_bonus is not None:
            rewards = rewards + token_bonus[start:end].float()
        advantages[start:end], returns[start:end] = gae(rewards, values[start:end], gamma, lam)
    return advantages, returns
