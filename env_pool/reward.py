"""The milestone reward: discrete levels, not speedup ratios, so timing noise cannot move it much.

A speed milestone is awarded only when the timing says so with confidence: the speedup's
bootstrap interval (the ratio of the baseline's median round to the candidate's, over resamples
of both sets of timed rounds) must clear its margin at its lower end. A point estimate decided
it before: one and the same correct cpp kernel, evaluated four times on an idle machine, earned
rewards 2, 2, 1 and 2. Below the bar, the milestone under it, and a message with the interval.

The bootstrap treats a phase's rounds as draws from one distribution. On the 2-core machine
they are not: the machine's speed shifts by 20-50% between stretches of seconds (an eager
baseline's rounds went 2.9-3.8 ms, then 4.2-8.7 ms, within one phase), and the baselines and
the candidate are timed in different stretches. Ten separate evaluations of one argmax kernel
then gave intervals against torch.compile from 0.72-0.85x to 1.66-2.16x, each sure of itself,
and milestones 3 and 2 by turns. So the interval is widened by the drift each timing shows
within its own phase (``drift``): a stretch that moved by d is no better evidence than that.
The baselines' rounds come from two trusted servers in turn (env.baseline_servers), pooled
in order, so a difference between the servers' processes is such a drift too. And by the drift
between the baselines and the candidate (``stretch_drift``): the harness times the eager baseline again
right after the candidate's rounds, and a baseline cached in a faster or slower stretch than
the candidate's shows as the recheck's distance from it.

Widened so, the interval stays honest but the milestone does not agree from one evaluation to
the next. So on the cpp backend each full evaluation times its baselines in turn with the
candidate (env.baseline_timing, env_pool/trusted/turns.py): round k of each side is one turn's,
in one stretch, and the bootstrap resamples whole turns, with nothing widened.
"""
from __future__ import annotations

import hashlib
import statistics
import struct

import torch

from configs.schema import RewardConfig
from protocol.results import EvalResult, Milestone, Timing

RESAMPLES = 2000  # bootstrap resamples of each pair of timings: the interval's ends move by under 1% between seeds
DRIFT_PARTS = 3  # a phase's rounds split in this many stretches, in order, to see its drift


def speedup_interval(baseline: Timing | None, candidate: Timing | None, confidence: float,
                     between: float = 0.0, in_turn: bool = False) -> tuple[float, float] | None:
    """The ``confidence`` bootstrap interval of baseline / candidate (ratio of medians); None without
    the rounds to resample. Seeded by the samples: the same timings, the same verdict.

    Timed apart, each side's rounds are resampled on their own and the interval widened at both
    ends by the largest drift: each timing's own, or ``between`` their stretches (stretch_drift).
    Timed ``in_turn`` (round k of each in one turn, env_pool/trusted/turns.py), whole turns are
    resampled and nothing is widened: a drift moved both sides of every turn together."""
    if baseline is None or candidate is None or not baseline.samples_ms or not candidate.samples_ms:
        return None
    b = torch.tensor(baseline.samples_ms, dtype=torch.float64)
    c = torch.tensor(candidate.samples_ms, dtype=torch.float64)
    digest = hashlib.sha256(struct.pack(f"{len(b) + len(c)}d", *b.tolist(), *c.tolist())).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    paired = in_turn and len(b) == len(c)
    picks = torch.randint(len(b), (RESAMPLES, len(b)), generator=gen)
    ratio = b[picks].median(dim=1).values / c[picks if paired else torch.randint(len(c), (RESAMPLES, len(c)), generator=gen)
                                              ].median(dim=1).values.clamp_min(1e-9)
    tail = (1.0 - confidence) / 2
    low, high = torch.quantile(ratio, torch.tensor([tail, 1.0 - tail], dtype=torch.float64)).tolist()
    widen = 1.0 if paired else 1.0 + max(pair_drift(baseline, candidate), between)
    return low / widen, high * widen


def pair_drift(baseline: Timing, candidate: Timing) -> float:
    """The larger drift of the two timings a speedup compares, each within its own rounds."""
    return max(drift(baseline), drift(candidate))


def stretch_drift(result: EvalResult) -> float:
    """How far the machine's speed moved between the baselines' rounds and the candidate's: the
    eager baseline's recheck, timed right after the candidate, against the eager timing the speedups
    use (the larger over the smaller median, less one; 0 without a recheck)."""
    if result.eager is None or result.eager_recheck is None:
        return 0.0
    a, b = result.eager.median_ms, result.eager_recheck.median_ms
    return max(a, b) / max(min(a, b), 1e-9) - 1.0


def drift(timing: Timing) -> float:
    """How far the machine's speed moved while ``timing``'s rounds ran: the slowest over the fastest
    median of its DRIFT_PARTS stretches, less one (0 with too few rounds to tell)."""
    samples, part = timing.samples_ms, len(timing.samples_ms) // DRIFT_PARTS
    if part < 2:
        return 0.0
    medians = [statistics.median(samples[k * part:(k + 1) * part]) for k in range(DRIFT_PARTS)]
    return max(medians) / max(min(medians), 1e-9) - 1.0


def milestone_of(result: EvalResult, cfg: RewardConfig) -> Milestone:
    """The highest milestone the result earns. Beating torch.compile also requires beating eager."""
    if result.failure is not None or not result.checks or not all(c.passed for c in result.checks):
        return Milestone.FAIL
    if not _clears(result.eager_interval, cfg.eager_margin):
        return Milestone.CORRECT
    if not _clears(result.compile_interval, cfg.compile_margin):
        return Milestone.FASTER_THAN_EAGER
    return Milestone.FASTER_THAN_COMPILE


def _clears(interval: list[float], margin: float) -> bool:
    return bool(interval) and interval[0] > 1.0 + margin


def reward_of(milestone: Milestone, cfg: RewardConfig) -> float:
    return {
        Milestone.FAIL: cfg.failure,
        Milestone.CORRECT: cfg.correct,
        Milestone.FASTER_THAN_EAGER: cfg.faster_than_eager,
        Milestone.FASTER_THAN_COMPILE: cfg.faster_than_compile,
    }[milestone]


def apply_reward(result: EvalResult, cfg: RewardConfig) -> EvalResult:
    """The milestone and reward; the speedups' intervals recorded, and a note where a point
    estimate would have claimed what its interval does not."""
    between = stretch_drift(result)
    for key, baseline, margin, name in (("eager_interval", result.eager, cfg.eager_margin, "eager"),
                                        ("compile_interval", result.compiled, cfg.compile_margin, "torch.compile")):
        interval = speedup_interval(baseline, result.candidate, cfg.confidence, between, result.timed_in_turn)
        setattr(result, key, [round(x, 4) for x in interval] if interval else [])
        point = baseline.median_ms / result.candidate.median_ms if baseline and result.candidate else None
        if interval and point and point > 1.0 + margin and interval[0] <= 1.0 + margin and result.failure is None:
            within = 0.0 if result.timed_in_turn else pair_drift(baseline, result.candidate)
            where = "within the rounds" if within >= between else "between the baselines' rounds and yours"
            moved = max(within, between)
            widened = f" (widened by the {moved:.0%} the machine's speed moved {where})" if moved >= 0.01 else ""
            note = (f"{point:.2f}x {name} is not a sure win: its {cfg.confidence:.0%} interval{widened} is "
                    f"{interval[0]:.2f}-{interval[1]:.2f}x, which must clear {1 + margin:.2f}x for the milestone")
            result.message = f"{result.message} {note}".strip()
    result.milestone = milestone_of(result, cfg)
    result.reward = reward_of(result.milestone, cfg)
    return result
