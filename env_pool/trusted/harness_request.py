"""One evaluation as the worker asks its trusted harness for it: the request's fields, typed.

The worker (env_pool/evaluate.py) builds it from the env config; it crosses to the harness
process as a msgpack map (``to_wire``) and is rebuilt there (``from_wire``), where a missing
or unknown field is refused as a malformed request. Fields keep the names of the env config
keys they come from (env.run_timeout_s is ``run_timeout_s`` here too).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# What each annotation's outer type accepts off the wire (msgpack gives lists for tuples, ints for whole floats).
_KINDS = {"bool": bool, "int": int, "float": (int, float), "str": str, "tuple": (list, tuple), "dict": dict}


@dataclass(frozen=True)
class HarnessRequest:
    task: dict[str, Any]  # tasks.task.Task.to_dict(): the reference the harness runs itself
    backend: str  # cpp or cuda
    mode: str  # verify (correctness only), full (and timed), baselines (the task's baselines only)
    baseline: bool  # time the eager and compiled baselines first, in their trusted server
    rules: str  # env.rules: tolerances, TF32, allowed libraries (tasks/rules.py)
    threads: int  # env.threads: the servers' and the reference's threads
    cpus: tuple[int, ...]  # the servers' CPUs (evaluate.split_cpus), sampled by the code sampler
    startup_cpus: tuple[int, ...]  # where waiting servers start up: the builds' CPUs
    harness_cpus: tuple[int, ...]  # the harness's own (evaluate.split_cpus): its thread spins there through every round
    warmup: int  # env.warmup: untimed rounds before the timed ones
    repetitions: int  # env.repetitions: timed rounds
    calls_per_round: int  # env.calls_per_round (0: the harness chooses, round_protocol.choose_calls), or the cached baselines' calls
    round_memory_mb: int  # env.round_memory_mb: what the calls of one round may hold, when the harness chooses them
    baseline_servers: int  # env.baseline_servers: trusted servers the baselines are timed in, their rounds pooled
    eager_recheck: bool  # env.eager_recheck: time the eager baseline again after a full evaluation's candidate rounds
    in_turn: bool  # env.baseline_timing: a full evaluation's baselines timed in turn with the candidate's rounds (env_pool/trusted/turns.py)
    turn_servers: int  # env.turn_servers: in turn, trusted servers per baseline, the timed turns going to each in rotation
    correctness_inputs: int  # env.correctness_inputs: fresh input sets checked before the rest
    adversarial_inputs: bool  # env.adversarial_inputs: the extreme sets too
    compile_mode: str  # env.compile_mode: the compiled baseline's torch.compile mode
    keep_cpus_awake: bool  # env.keep_cpus_awake: a spinner at the lowest priority on each of ``cpus`` through the request (awake_cpus.py; off by default)
    seccomp: bool  # env.seccomp: the candidate's server under the seccomp filter
    code_sampling: bool  # env.code_sampling: the trusted code sampler judges which code ran
    memory_limit_mb: int  # env.memory_limit_mb: a candidate's server
    baseline_memory_limit_mb: int  # env.baseline_memory_limit_mb: the baselines' trusted server
    warm_servers: int  # env.warm_servers: candidates' servers started ahead
    warm_baseline_servers: int  # env.warm_baseline_servers: baselines' servers started ahead
    run_timeout_s: float  # env.run_timeout_s: a candidate's server, from its run's start
    baseline_timeout_s: float  # env.run_timeout_s + env.compile_timeout_s: the baselines compile too
    scratch: str  # the candidate's files: its server's folder is made beside it
    reference_cwd: str  # the baselines' private folder: their server's folder is made beside it
    inductor_dir: str  # the shared inductor cache the baselines' server writes
    hidden: tuple[str, ...]  # paths a candidate's server must not see (the worker's private folders)
    required_isolation: tuple[str, ...]  # what a candidate's sandbox must have, or the run is refused

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, data: Any) -> "HarnessRequest":
        """The request a worker sent; a field missing, unknown or of the wrong kind is a ValueError naming it."""
        if not isinstance(data, dict):
            raise ValueError(f"a request is a map of fields, not a {type(data).__name__}")
        kinds = {f.name: f.type.split("[")[0] for f in dataclasses.fields(cls)}
        unknown, missing = sorted(map(str, set(data) - set(kinds))), [k for k in kinds if k not in data]
        if unknown or missing:
            raise ValueError(f"a malformed request: unknown field(s) {unknown}, missing {missing}")
        values = {}
        for name, value in data.items():
            want = _KINDS[kinds[name]]
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise ValueError(f"request field {name!r} must be of type {kinds[name]}, got {type(value).__name__}")
            values[name] = tuple(value) if kinds[name] == "tuple" else value
        return cls(**values)

    def server_memory_mb(self, trusted: bool) -> int:
        """The host memory limit of a server: the baselines' or a candidate's."""
        return self.baseline_memory_limit_mb if trusted else self.memory_limit_mb

    def server_timeout_s(self, trusted: bool) -> float:
        return self.baseline_timeout_s if trusted else self.run_timeout_s

    def waiting_servers(self, trusted: bool) -> int:
        """How many servers of the kind wait ahead (env.warm_baseline_servers, env.warm_servers)."""
        return self.warm_baseline_servers if trusted else self.warm_servers
