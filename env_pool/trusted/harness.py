"""The trusted harness: drives one evaluation's rounds, keeps the clock, verifies every output.

TRUSTED SIDE. No candidate code ever runs in this process (``python -m env_pool.trusted.harness --serve``,
kept warm by env_pool/trusted/harness_process.py, one per worker). It decides every number the reward uses:

- inputs: fresh contents for every round, from seeds drawn here and never sent anywhere;
  written into the shared input slots (the same addresses every round, new contents);
- time: each round on this process's own clock, from GO to the moment the round's outputs
  have been copied out of the shared slots, less the median of the same server's ``null``
  phase (the protocol's own cost, measured before any candidate code was loaded; in turn, of
  every server's null phase pooled, the same for each side: shared_null);
- correctness: every round's outputs, warm-up and timed alike, against the reference run
  here on the same inputs; the output slots are NaN-poisoned before each round, so a missing
  output fails; inputs are compared with the private copies after each round (mutation);
- baselines: eager and torch.compile served by trusted servers under the same protocol,
  sandbox, CPU set and thread count as the candidate: on the cpp backend in turn with the
  candidate's timed rounds, a round of each per turn (env.baseline_timing, env_pool/trusted/turns.py);
  otherwise before it, once per task per worker, and then eager again right after the
  candidate's timed rounds (env.eager_recheck), to see whether the machine's speed moved
  since the baselines were timed;
- which code did the work: the servers' CPUs sampled by the kernel from GO to DONE of every
  round, each sample attributed to the file mapped at its address (env_pool/trusted/code_sampler.py):
  torch or library code doing the work fails the candidate, whatever its process did to its
  own detectors.

What the candidate's side can send, and how it is taken (a server is untrusted even when it
serves the reference: it is the same code, in the same kind of process):
- DONE (control word): only ends the round's wait; a wrong value keeps waiting; -round marks
  a failed round (a failure can only fail the candidate);
- READY: only ends the wait for a phase; a negative value fails the phase;
- the message area and the result channel: text for messages and guard violations, trimmed,
  parsed defensively; a violation can only fail the candidate;
- the output slots: data, verified here;
- its exit status, output and resource use, through run_sandboxed.
"""
from __future__ import annotations

import contextlib
import gc
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from env_pool.isolation.sandbox import SandboxError
from env_pool.shared.inputs import ADVERSARIAL, adversarial
from env_pool.trusted.awake_cpus import Awake, awake
from env_pool.trusted.code_sampler import judge
from env_pool.trusted.harness_request import HarnessRequest
from env_pool.trusted.turns import BASELINES, BaselinesFailed, merged_rounds, serve_candidate
from env_pool.trusted.round_protocol import (NULL_ROUNDS, PhaseRun, Rounds, RoundsFailed, above_protocol_noise, net_timing,
                                             pooled, seccomp_works, serve_phases, set_tf32)
from env_pool.trusted.server_pool import ServerPools, log
from protocol.results import Timing



def evaluate_rounds(rounds: Rounds, pools: ServerPools, request: HarnessRequest) -> dict:
    """The whole trusted side of one evaluation (mode "baselines": the task's baselines only); a plain dict for the worker."""
    result: dict[str, Any] = {"ok": False, "failure": None, "message": "", "checks": [], "violations": [], "run_log": ""}
    rounds.request = request
    set_tf32(rounds.rules.tf32)  # the harness's reference runs under the request's rules (a cached task's too)
    warmup, reps = request.warmup, request.repetitions
    full = request.mode == "full"
    sets = rounds.discrimination()
    # Timed rounds, the baselines' and the candidate's alike, on inputs that need the whole
    # computation: a task whose own inputs let a trivial kernel pass (all-positive ReLU inputs)
    # is timed on its first discriminating set. Timed on its own sets, a kernel that recognised
    # them returned its input there and computed only on the checked sets (rt3_relu_sign_probe).
    timed_set = rounds.transformed(sets.needed[0]) if sets.needed else None
    timed_label = sets.needed[0] if sets.needed else "own"
    in_turn = full and request.in_turn  # the baselines' timed rounds in turn with the candidate's (env_pool/trusted/turns.py)
    if request.baseline and not in_turn:
        timings, failed = time_baselines(rounds, pools, request, BASELINES, timed_set, request.baseline_servers)
        if failed:
            result.update(failed)
            return result
        result.update(timings)
    if request.mode == "baselines":
        result["ok"] = True
        return result
    if request.seccomp and not seccomp_works():
        result.update(failure="infra", message="the seccomp filter cannot be installed on this machine: candidates are "
                                               "not run without it (env.seccomp=false turns it off, for comparisons only)")
        return result
    checked = request.correctness_inputs
    # Every round is checked (and watched by the server's fallback detector): the task's own
    # sets, then the transformed sets it needs to tell a correct kernel from a trivial one
    # (tasks/discriminate.py), then the extreme sets (adversarial_inputs); timing reads only
    # the last `reps` rounds.
    checking = sets.needed + sets.guards
    extreme = adversarial(rounds.fresh_inputs, secrets.randbits(62)) if request.adversarial_inputs else []
    candidate_rounds = ([None] * checked + [rounds.transformed(name) for name in checking] + extreme
                        + ([timed_set] * (warmup + reps) if full else []))
    labels = (["own"] * checked + checking + list(ADVERSARIAL[:len(extreme)])
              + [timed_label] * (warmup + reps if full else 0))
    result["verification_sets"] = sets.needed
    if not sets.ok:
        result["verification_note"] = (f"this task's outputs cannot tell a correct kernel from a trivial one on any set the "
                                       f"environment makes ({sets.describe()})")
    # The null phase comes first in every mode: its rounds time the protocol (full mode) and show
    # the code sampler what serving the outputs costs in torch before the candidate's code loads.
    phases = [("null", rounds.null_rounds(warmup + reps if full else NULL_ROUNDS), False, None),
              ("candidate", candidate_rounds, True, labels)]
    try:
        runs, report, baseline_runs, served = serve_candidate(rounds, pools, request, phases, timed_set,
                                                              warmup + reps if full else 0, BASELINES if in_turn else ())
    except RoundsFailed as err:
        result.update(failure=err.kind, message=str(err), run_log=err.output, violations=err.violations)
        return result
    except BaselinesFailed as err:  # the candidate's violations, if any, fail it all the same
        result.update(failure="infra", message=str(err), run_log=err.output, violations=err.violations)
        return result
    reps = served - warmup  # the timed turns served: past MIN_TURNS, their time budget may end them early
    null = runs["null"].staging_ns[warmup:]
    if in_turn:
        null = shared_null(runs, baseline_runs, warmup)
        timings, failed = baseline_timings(baseline_runs, warmup, rounds.calls, null)
        if failed:
            result.update(failed)
            return result
        result.update(timings, in_turn=True)
    run = runs["candidate"]
    result["run_log"] = report["output"]
    result["warm_server"] = report["warm_server"]
    result["checks"] = [c.__dict__ for c in run.checks]
    result["violations"] = report["violations"]
    if run.code is not None:  # the trusted sampler's verdict on which code did the work
        result["code_samples"] = run.code.to_dict()
        if run.code.lost > run.code.total // 10:
            result.update(failure="infra", message=f"the code sampler lost {run.code.lost} samples (the harness was "
                                                   "starved of CPU): the rounds cannot be attributed; retried")
            return result
        timed_ns = run.samples_ns[-reps:] if full else []
        result["violations"] += judge(run.code, runs["null"].code, torch_rule=rounds.device == "cpu", timed_ns=timed_ns)
    if run.mutated:
        result["violations"].append({"guard": "input_mutation", "reason": "ModelNew.forward changed its inputs in place"})
    if run.expected.varies and not run.outputs.varies:
        result.update(failure="wrong", message="the output does not change with the inputs")
        return result
    if full:
        timing = net_timing(run.samples_ns[-reps:], null, rounds.calls)
        if above_protocol_noise(timing, run.staging_ns[-reps:]):
            result["candidate"] = timing.__dict__
        else:  # correct, and no speed claim either way
            result["timing_note"] = (f"your kernel's time ({timing.median_ms * 1e3:.1f} us a call) was within the "
                                     "timing protocol's own noise: speed not judged")
    if request.eager_recheck and not in_turn and "candidate" in result and not result["violations"]:
        # The eager baseline again, in the stretch right after the candidate's rounds: how far the
        # machine's speed moved since the baselines' rounds (env_pool/reward.py widens the speedups'
        # intervals by it). On the 2-core VM it moves 20-50% between stretches of seconds, and one
        # argmax kernel, timed against baselines cached from another stretch, earned "faster than
        # torch.compile" in 2 of 10 separate evaluations and "faster than eager" in the rest.
        timings, failed = time_baselines(rounds, pools, request, ("eager",), timed_set)
        if failed.get("untimeable"):  # how far the machine moved is unknown: correct, and no speed claim
            del result["candidate"]
            result["timing_note"] = ("the eager baseline, timed again right after your rounds, was within the timing "
                                     "protocol's own noise, so how far the machine's speed moved is unknown: speed not judged")
        elif failed:
            result.update(failed, message=f"the eager baseline's recheck after your rounds: {failed['message']}")
            return result
        else:
            result["eager_recheck"] = timings["eager"]
    result["ok"] = True
    return result


def time_baselines(rounds: Rounds, pools: ServerPools, request: HarnessRequest, names: tuple[str, ...],
                   timed_set: Any, servers: int = 1) -> tuple[dict[str, dict], dict]:
    """The named baselines timed on ``timed_set`` in ``servers`` trusted servers, one after another,
    each after its own null phase, their rounds pooled in order: (Timing dicts by name, {}), or
    ({}, the infra failure to report) when they could not be.

    More than one server because a server's process biases its rounds: ten separate evaluations
    of one argmax kernel on the 2-core VM timed the compiled baseline at 1.21-1.28 ms in five
    servers and 1.47-1.95 ms in the other five, eager and the candidate steady, each timing sure
    of itself; "faster than torch.compile" went to whichever evaluation drew a slow server.
    Pooled in order, two servers' difference is a drift the speedup's interval is widened by.
    """
    parts: dict[str, list[Timing]] = {name: [] for name in names}
    for _ in range(max(1, servers)):
        timings, failed = _time_in_one_server(rounds, pools, request, names, timed_set)
        if failed:
            return {}, failed
        for name in names:
            parts[name].append(timings[name])
    return {name: pooled(timings).__dict__ for name, timings in parts.items()}, {}


def _time_in_one_server(rounds: Rounds, pools: ServerPools, request: HarnessRequest, names: tuple[str, ...],
                        timed_set: Any) -> tuple[dict[str, Timing], dict]:
    """The named baselines' timings in one trusted server, or the infra failure when it could not time them."""
    warmup, reps = request.warmup, request.repetitions
    try:
        runs, _ = serve_phases(rounds, pools, [("null", rounds.null_rounds(warmup + reps), False, None)]
                               + [(name, [timed_set] * (warmup + reps), False, None) for name in names],
                               Path(request.reference_cwd), trusted=True)
    except RoundsFailed as err:
        return {}, {"failure": "infra", "message": f"the baselines failed ({err.kind}): {err}", "run_log": err.output}
    return _timings_of(runs, names, warmup, rounds.calls)


def shared_null(candidate_runs: dict[str, PhaseRun], baseline_runs: dict[str, list[dict[str, PhaseRun]]],
                warmup: int) -> list[int]:
    """The staging of every server's null phase, pooled: what is subtracted from each side's rounds in turn.

    The harness stages the same inputs and outputs for each of a turn's servers, so its staging in
    the turns was the same for the three to within 0.03 ms (argmax on 2 cores). Each server's own
    null phase, timed alone, measured it at 0.49-0.97 ms: subtracting each its own moved one side's
    net time against the other's, and ten evaluations of one argmax kernel put it at 1.11-1.51x
    torch.compile (1.22-1.45x with one pooled constant). Every null phase ran before any candidate
    code loaded, so none of them is the candidate's to move.
    """
    parts = [candidate_runs["null"], *(runs["null"] for servers in baseline_runs.values() for runs in servers)]
    return [ns for run in parts for ns in run.staging_ns[warmup:]]


def baseline_timings(runs: dict[str, list[dict[str, PhaseRun]]], warmup: int, calls: int,
                     null: list[int]) -> tuple[dict[str, dict], dict]:
    """The baselines' timings from the runs of their servers in turn (each baseline's merged turn by
    turn: turns.merged_rounds), each less the ``null`` staging (shared_null): (Timing dicts by name, {}),
    or ({}, the infra failure to report)."""
    timings: dict[str, dict] = {}
    for name, servers in runs.items():
        phase = merged_rounds([server[name] for server in servers], warmup)
        timed, failed = _timings_of({name: phase}, (name,), warmup, calls, null)
        if failed:
            return {}, failed
        timings[name] = timed[name].__dict__
    return timings, {}


def _timings_of(runs: dict[str, PhaseRun], names: tuple[str, ...], warmup: int, calls: int,
                null: list[int] | None = None) -> tuple[dict[str, Timing], dict]:
    """The named phases' timings (``calls`` calls a round), each less the ``null`` staging (default: its
    server's null phase's), or the infra failure when one cannot be timed."""
    null = runs["null"].staging_ns[warmup:] if null is None else null
    timings = {}
    for name in names:
        disturbed = runs[name].disturbance
        if disturbed is not None and disturbed.too_disturbed:  # never cached: they would decide every reward
            return {}, {"failure": "infra", "message": f"the {name} baseline was disturbed: {disturbed.describe()}; retried"}
        timing = net_timing(runs[name].samples_ns[warmup:], null, calls)
        if not above_protocol_noise(timing, runs[name].staging_ns[warmup:]):  # never cached: it would decide every reward
            return {}, {"failure": "infra", "untimeable": True,
                        "message": f"the {name} baseline ({timing.median_ms * 1e3:.1f} us) was within the timing "
                                   "protocol's own noise; retried"}
        timings[name] = timing
    return timings, {}


CACHE_DEVICE_SHARE = 0.25  # of the GPU's memory, at most, for tasks kept for later (the servers need the rest)


class TaskCache:
    """Each task's reference and round memory, kept for the next evaluation of the same task.

    At most ``size`` tasks, and on a GPU at most ``budget_bytes`` of them besides the newest:
    KernelBench's level-1 problems hold 6-8 GiB a tensor, so four of them kept (slots, snapshots
    and reference: ~20 GiB each) fill most of an H100. A baselines sweep there (2026-11-26) saw
    a trusted server fail for 7 GiB right after four such problems, and 51 of 172 problems fail
    out of memory in bursts.
    """

    def __init__(self, size: int = 4, budget_bytes: int | None = None):
        self.size = size
        self.budget_bytes = budget_bytes
        self.entries: dict[tuple, Rounds] = {}

    @staticmethod
    def key(request: HarnessRequest) -> tuple:
        task = request.task
        return task.get("id"), hash(task.get("source")), request.backend, request.threads, request.rules

    def get(self, request: HarnessRequest) -> Rounds:
        key = self.key(request)
        rounds = self.entries.pop(key, None)
        if rounds is not None and 0 < request.calls_per_round != rounds.calls:
            rounds.close()  # slots for other calls a round: the request's (its cached baselines') decide
            rounds = None
        rounds = rounds or Rounds(request)
        self.entries[key] = rounds  # most recent last
        budget = self.budget_bytes if self.budget_bytes is not None else device_budget(rounds.device)
        held = {k: r.device_bytes() for k, r in self.entries.items()} if budget != float("inf") else {}
        evicted = False
        while len(self.entries) > 1 and (len(self.entries) > self.size or sum(held.values()) > budget):
            oldest = next(iter(self.entries))
            self.entries.pop(oldest).close()
            held.pop(oldest, None)
            evicted = True
        if evicted:
            release_cached_memory()
        return rounds

    def keep_only(self, request: HarnessRequest) -> bool:
        """Drop every task but the request's (their references and inputs free the device's memory); True if any was."""
        others = [k for k in self.entries if k != self.key(request)]
        for key in others:
            self.entries.pop(key).close()
        if others:
            release_cached_memory()
        return bool(others)


def device_budget(device: str) -> float:
    """The device memory cached tasks may hold: CACHE_DEVICE_SHARE of a GPU's, no bound on the CPU."""
    if device != "cuda":
        return float("inf")
    return CACHE_DEVICE_SHARE * torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory


def release_cached_memory() -> None:
    """What dropped tasks held, back to the driver: the servers allocate in processes of their own,
    and the next task's slots are a driver allocation (cuMemCreate), which torch's cache does not
    serve."""
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def handle(payload: Any, cache: TaskCache, pools: ServerPools) -> dict:
    """One request of the worker: a verdict, or an infra failure that names the harness's own fault.

    A request that ran out of device memory while other tasks were cached is tried once more
    without them: KernelBench's level-1 elementwise problems take 6 GiB a tensor, and four of
    them cached (their references, their inputs) filled an H100 for every request after.
    """
    begin = time.monotonic()
    try:
        request = HarnessRequest.from_wire(payload)
    except ValueError as err:
        log(f"a malformed request: {err}")
        return {"ok": False, "failure": "infra", "message": f"the harness failed: {err}"}
    what = f"{request.task.get('id')} {request.mode}{' with baselines' if request.baseline else ''}"
    log(f"{what}: begun ({len(cache.entries)} tasks cached)")
    verdict = _attempt(request, cache, pools)
    if verdict.get("failure") == "infra" and out_of_memory(str(verdict.get("message", ""))) and cache.keep_only(request):
        log(f"{what}: out of device memory, tried again without the other cached tasks")
        verdict = _attempt(request, cache, pools)
    outcome = verdict.get("failure") or "ok"
    reason = str(verdict.get("message", "")).splitlines()[0][:1000] if verdict.get("failure") else ""
    log(f"{what}: {outcome} in {time.monotonic() - begin:.1f} s{': ' + reason if reason else ''}")
    return verdict


def out_of_memory(message: str) -> bool:
    """A CUDA allocation failure, as torch or the driver words it (CUresult 2 is CUDA_ERROR_OUT_OF_MEMORY)."""
    return "out of memory" in message.lower() or re.search(r"\bCUresult 2\b", message) is not None


def _attempt(request: HarnessRequest, cache: TaskCache, pools: ServerPools) -> dict:
    try:
        with on_cpus(request.harness_cpus), awake(spinner_cpus(request)) as spinners:
            rounds = cache.get(request)
            rounds.awake = spinners
            try:
                return evaluate_rounds(rounds, pools, request)
            finally:
                rounds.awake = Awake()  # none: a cached task outlives the request's spinners
    except SandboxError as err:
        return {"ok": False, "failure": "infra", "message": f"the sandbox failed: {err}"}
    except Exception as err:  # the harness's own fault (or the task's): never the candidate's
        return {"ok": False, "failure": "infra", "message": f"the harness failed: {type(err).__name__}: {err}"}


def spinner_cpus(request: HarnessRequest) -> list[int]:
    """The server CPUs that get a spinner (env.keep_cpus_awake): none the harness runs on, where a
    spinner runnable through the harness's staging (on the round's clock) would now and then take a
    slice from it (a machine of no more CPUs than the servers' threads gives the harness the
    servers' CPUs: env_pool/evaluate.split_cpus)."""
    return [cpu for cpu in request.cpus if cpu not in request.harness_cpus] if request.keep_cpus_awake else []


@contextlib.contextmanager
def on_cpus(cpus: tuple[int, ...]) -> Iterator[None]:
    """The calling thread (and the threads it starts) on ``cpus`` meanwhile; on all of them again after.

    The harness spins through every round on the thread that serves it. Pinning the harness's
    process from outside (HarnessProcess) pins the thread it started with, and a harness run in
    the worker's own process (scripts/profile_harness.py, the tests) was not pinned at all: on a
    2-core machine its thread was seen on the server's one CPU during rounds.
    """
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)  # 0: the calling thread, on Linux
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def main() -> None:
    from env_pool.trusted.harness_process import serve_forever

    cache, pools = TaskCache(), ServerPools()
    try:
        serve_forever(lambda payload: handle(payload, cache, pools))
    finally:
        pools.close()


if __name__ == "__main__":
    main()
