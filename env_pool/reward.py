"""The milestone reward: discrete levels, not speedup ratios, so timing noise cannot move it much.

A speedup counts only when it clears its margin plus ``noise_factor`` times the measured noise
(IQR/median) of the slower of the two timings: a 3% "win" inside 5% noise is no win.
"""
from __future__ import annotations

from configs.schema import RewardConfig
from env_pool.results import EvalResult, Milestone, Timing


def _clears(baseline: Timing | None, candidate: Timing | None, margin: float, noise_factor: float) -> bool:
    if baseline is None or candidate is None or candidate.median_ms <= 0:
        return False
    noise = max(baseline.noise, candidate.noise)
    return baseline.median_ms / candidate.median_ms > 1.0 + margin + noise_factor * noise


def milestone_of(result: EvalResult, cfg: RewardConfig) -> Milestone:
    """The highest milestone the result earns. Beating torch.compile also requires beating eager."""
    if result.failure is not None or not result.checks or not all(c.passed for c in result.checks):
        return Milestone.FAIL
    if not _clears(result.eager, result.candidate, cfg.eager_margin, cfg.noise_factor):
        return Milestone.CORRECT
    if not _clears(result.compiled, result.candidate, cfg.compile_margin, cfg.noise_factor):
        return Milestone.FASTER_THAN_EAGER
    return Milestone.FASTER_THAN_COMPILE


def reward_of(milestone: Milestone, cfg: RewardConfig) -> float:
    return {
        Milestone.FAIL: cfg.failure,
        Milestone.CORRECT: cfg.correct,
        Milestone.FASTER_THAN_EAGER: cfg.faster_than_eager,
        Milestone.FASTER_THAN_COMPILE: cfg.faster_than_compile,
    }[milestone]


def apply_reward(result: EvalResult, cfg: RewardConfig) -> EvalResult:
    result.milestone = milestone_of(result, cfg)
    result.reward = reward_of(result.milestone, cfg)
    return result
