"""What the environment returns: EvalResult and its parts, plain msgpack-serialisable data.

Every evaluation ends in an EvalResult, whatever the candidate did: a crash, a hang, a guard
violation and a wrong answer are all results (with ``failure`` saying which), never exceptions
that reach the caller. Only the environment's own faults are ``infra`` failures, and only
those are retried.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import msgpack


class Milestone(IntEnum):
    """The paper's discrete reward levels, in order: each implies the ones below it."""

    FAIL = 0
    CORRECT = 1
    FASTER_THAN_EAGER = 2
    FASTER_THAN_COMPILE = 3


# Why an evaluation failed. "infra" alone is the environment's fault; the rest are the candidate's.
FAILURE_KINDS = (
    "compile_error",  # the compiler rejected the sources, or ModelNew failed to import
    "crash",  # the candidate's process died: segfault, abort, illegal memory access, uncaught error
    "timeout",  # wall-clock or CPU-time limit
    "out_of_memory",  # memory limit
    "guard",  # a reward-hacking guard fired: see violations
    "wrong",  # ran, but outputs do not match the reference
    "missing_files",  # the solution files the backend needs are not in the workspace
    "infra",  # the environment itself failed (worker, device, runner start): retried once
)


@dataclass
class Violation:
    guard: str  # which guard: torch_fallback, import_reference, tamper, subprocess, network, ...
    reason: str  # what the candidate did, in one line


@dataclass
class InputCheck:
    """Correctness on one input set."""

    index: int
    passed: bool
    max_abs_error: float | None = None  # over all outputs; None when shapes or dtypes differ
    reason: str = ""  # why it failed: shape, dtype, NaN, tolerance, ...
    # Which kind of set: "own" (the task's get_inputs), a discriminating transform the task needs
    # (tasks/discriminate.py: "shift", "sign_flip", ...), or an adversarial one ("large", ...).
    inputs: str = "own"


@dataclass
class Timing:
    median_ms: float
    iqr_ms: float  # interquartile range of the repetitions
    repetitions: int
    samples_ms: list[float] = field(default_factory=list)  # each timed round's net time a call: what env_pool/reward.py resamples
    calls: int = 1  # forward calls in each timed round (env.calls_per_round): a sample is its round's time over them

    @property
    def noise(self) -> float:
        """IQR over median: the relative spread a speedup must clear to mean anything."""
        return self.iqr_ms / self.median_ms if self.median_ms > 0 else float("inf")


@dataclass
class EvalResult:
    task_id: str
    backend: str
    milestone: Milestone = Milestone.FAIL
    reward: float = 0.0
    failure: str | None = None  # one of FAILURE_KINDS, None on success
    message: str = ""  # short, readable summary for the agent: first compiler errors, the mismatch, the guard
    compile_log: str = ""  # compiler output, trimmed to the first errors
    run_log: str = ""  # the candidate's stdout/stderr, trimmed
    checks: list[InputCheck] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    eager: Timing | None = None  # the reference in eager mode
    compiled: Timing | None = None  # the reference under torch.compile
    candidate: Timing | None = None
    # The eager baseline timed again right after the candidate's rounds: how far the machine's
    # speed moved since the baselines' rounds (env_pool/reward.py widens the intervals by it)
    eager_recheck: Timing | None = None
    timed_in_turn: bool = False  # the candidate's and the baselines' timed rounds were served in turn (env.baseline_timing): sample k of each is one turn's
    compile_s: float = 0.0  # wall-clock seconds of the compile step (0 on a cache hit)
    cache_hit: bool = False
    wall_s: float = 0.0  # wall-clock seconds of the whole evaluation
    warm_server: bool = False  # the candidate's server was started before this evaluation asked for one (env.warm_servers)
    code_samples: dict = field(default_factory=dict)  # where the candidate's CPU time went in its rounds: samples per category (env_pool/trusted/code_sampler.py)
    eager_interval: list[float] = field(default_factory=list)  # the speedup over eager's bootstrap interval [low, high] (env_pool/reward.py); empty without timings
    compile_interval: list[float] = field(default_factory=list)  # the same over torch.compile

    def __post_init__(self) -> None:
        if self.failure is not None and self.failure not in FAILURE_KINDS:
            raise ValueError(f"EvalResult.failure must be one of {FAILURE_KINDS}, got {self.failure!r}")
        if self.failure is not None and self.milestone != Milestone.FAIL:
            raise ValueError("a failed evaluation cannot reach a milestone above FAIL")
        self.milestone = Milestone(self.milestone)

    @property
    def correct(self) -> bool:
        return self.milestone >= Milestone.CORRECT

    @property
    def speedup_vs_eager(self) -> float | None:
        return _ratio(self.eager, self.candidate)

    @property
    def speedup_vs_compile(self) -> float | None:
        return _ratio(self.compiled, self.candidate)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["milestone"] = int(self.milestone)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EvalResult":
        d = dict(d)
        d["checks"] = [InputCheck(**c) for c in d.get("checks", [])]
        d["violations"] = [Violation(**v) for v in d.get("violations", [])]
        for key in ("eager", "compiled", "candidate", "eager_recheck"):
            d[key] = Timing(**d[key]) if d.get(key) else None
        return cls(**d)

    def pack(self) -> bytes:
        return msgpack.packb(self.to_dict())

    @classmethod
    def unpack(cls, data: bytes) -> "EvalResult":
        return cls.from_dict(msgpack.unpackb(data))


def _ratio(baseline: Timing | None, candidate: Timing | None) -> float | None:
    if baseline is None or candidate is None or candidate.median_ms <= 0:
        return None
    return baseline.median_ms / candidate.median_ms
