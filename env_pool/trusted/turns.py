"""The candidate's rounds, its timed ones served in turns: alone, or a round of each baseline per turn.

TRUSTED SIDE (env_pool/trusted/harness.py, for every evaluation). The candidate's server takes its
null phase, then its checked rounds, then its turns: warm-up, then timed. Each turn's rounds make
Rounds.calls forward calls each, as the null phase's do. The turns stop once they
have taken a quarter of the candidate's time limit (env.run_timeout_s), after MIN_TURNS of them:
env.repetitions (120) rounds of a slow kernel must not run its server into that limit.

With env.baseline_timing=in_turn (the cpp backend's default), each turn also serves one round of
each baseline. Baselines timed apart from the candidate, in a stretch and a server of their own,
decided milestones by which stretch and which server each evaluation drew: on the 2-core VM the
machine's speed moves by 20-50% between stretches of seconds, and ten separate evaluations of one
argmax kernel timed its torch.compile baseline at 1.87-3.05 ms and earned milestones 2 (eight
times), 3 and 1. Served in turn, a turn's three rounds share their stretch, and env_pool/reward.py
resamples whole turns: the machine's drift moves both sides of a speedup together instead of
widening its interval.

A server's process biases all of its rounds (one eager server's rms_norm rounds ran 20% slower than
the others' over a whole evaluation), and no count of turns in one server averages that away. So
each baseline has env.turn_servers trusted servers, and the timed turns go to each in rotation
(every one of them takes every warm-up turn): a slow one is half of its baseline's rounds, and the
difference between them is in the turns the bootstrap resamples.

Every server is started, built (torch.compile included) and frozen in its timed phase before the
turns begin, so nothing builds beside a timed round; the baselines' servers are built before the
candidate's is taken, so its time limit is not spent on torch.compile. The turns go through every
order of the three servers, so each follows each other equally often. What the frozen candidate
could leave to land on the next round, a baseline's: its slot memory (the baselines' servers have
slots of their own, round_protocol.Session), and timers (looked for after each of its rounds).

The CPU only (env_pool/evaluate.py refuses in_turn on a GPU): there the candidate's queued work
runs on after its server is frozen, into the next round, and every server's round allocates in
the one arena of the slot memory.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import time
from pathlib import Path
from typing import Any

from env_pool.trusted.harness_request import HarnessRequest
from env_pool.trusted.round_protocol import Phase, PhaseRun, Rounds, RoundsFailed, Session
from env_pool.trusted.server_pool import ServerPools

BASELINES = ("eager", "compiled")
MIN_TURNS = 30  # timed turns served, whatever the time budget (env.repetitions' default before turns)
BUDGET_SHARE = 0.25  # of env.run_timeout_s, for the timed turns past MIN_TURNS


class BaselinesFailed(Exception):
    """A baselines' server failed: the environment's fault (infra), whatever the candidate did."""

    def __init__(self, message: str, output: str = ""):
        super().__init__(message)
        self.output = output
        self.violations: list[dict] = []  # the candidate's, when its own rounds passed: they fail it all the same


def serve_candidate(rounds: Rounds, pools: ServerPools, request: HarnessRequest, phases: list[Phase], timed_set: Any,
                    timed: int, baselines: tuple[str, ...] = ()) -> tuple[dict[str, PhaseRun], dict, dict[str, list[dict[str, PhaseRun]]], int]:
    """The candidate's two phases (null; its rounds, whose last ``timed`` are turns: warm-up, then
    timed), each turn with one round of each of ``baselines`` on ``timed_set`` (none: the candidate's
    rounds alone, its baselines cached), from request.turn_servers servers each in rotation: (the
    candidate's runs, its server's report, by baseline the runs of each of its servers, the turns
    served). The candidate's failure is raised as RoundsFailed; a baselines' server's, when
    the candidate's own rounds did not fail, as BaselinesFailed."""
    (_, null, _, _), (_, todo, _, labels) = phases
    checked = len(todo) - timed
    served = 0
    with contextlib.ExitStack() as held:  # every server stopped and released, whatever fails
        teams = [[held.enter_context(Session(rounds, pools, ["null", name], Path(request.reference_cwd), trusted=True,
                                             own_memory=True)) for name in baselines]
                 for _ in range(max(1, request.turn_servers) if baselines else 0)]  # a server of each baseline per team
        others = [session for team in teams for session in team]
        for session in others:  # all started before any null rounds: no start-up beside them
            session.begin(len(null))
        for session in others:
            _null_then_begin(session, pools, null, timed)
        if not all(session.ok for session in others):
            raise _baselines_failure(others)
        candidate = held.enter_context(Session(rounds, pools, ["null", "candidate"], Path(request.scratch), trusted=False))
        if candidate.begin(len(null)) and _null_then_begin(candidate, pools, null, len(todo)):
            with pools.quiet(candidate.timed):
                if candidate.serve(todo[:checked], True, labels[:checked]):
                    served = _turns(candidate, teams, todo[checked:], labels[checked:], timed_set, request.warmup,
                                    request.warmup + MIN_TURNS, BUDGET_SHARE * request.run_timeout_s)
        for session in [candidate, *others]:
            session.end()
        runs, report = candidate.finish()  # raises the candidate's own failure: it stands whatever the baselines did
        if not all(session.ok for session in others):
            failed = _baselines_failure(others)
            failed.violations = report["violations"]
            raise failed
        return runs, report, {name: [_runs_of(team[k]) for team in teams] for k, name in enumerate(baselines)}, served


def _null_then_begin(session: Session, pools: ServerPools, null: list, count: int) -> bool:
    """The null phase's rounds, then the next phase begun (its model built) with ``count`` rounds; whether all went well."""
    with pools.quiet(session.timed):
        session.serve(null, False, calls=session.rounds.calls)
    return session.end() and session.begin(count)


def _turns(candidate: Session, teams: list[list[Session]], todo: list, labels: list[str], timed_set: Any,
           warmup: int, at_least: int, budget_s: float) -> int:
    """One round of each server per turn, through every order of them; the turns served. ``teams``: one
    server of each baseline per team (none: the candidate alone); every team takes every warm-up
    turn, then the timed turns go to one team each in rotation. Stops at the first failure, and past
    ``budget_s`` once ``at_least`` turns are served."""
    teams = teams or [[]]
    orders = list(itertools.permutations(range(1 + len(teams[0]))))  # all of them, in turn: each server follows each as often
    begun = time.monotonic()
    for turn, (given, label) in enumerate(zip(todo, labels)):
        if turn >= at_least and time.monotonic() - begun > budget_s:
            return turn
        playing = teams if turn < warmup else [teams[(turn - warmup) % len(teams)]]
        first = [candidate, *playing[0]]
        for session in [first[k] for k in orders[turn % len(orders)]] + [s for team in playing[1:] for s in team]:
            calls = session.rounds.calls  # each timed round's: the null phase's too
            served = (session.serve([given], True, [label], calls) if session is candidate
                      else session.serve([timed_set], False, calls=calls))
            if served and session is candidate and any(playing):
                served = _no_timers_left(candidate)
            if not served:
                return turn
    return len(todo)


def merged_rounds(servers: list[PhaseRun], warmup: int) -> PhaseRun:
    """One baseline's timed phase from its servers in rotation: the first server's warm-up rounds, then
    the timed rounds in the order of the turns (server k took timed turns k, k + n, ...), so each is
    paired with the candidate's round of its turn (env_pool/reward.py)."""
    if len(servers) == 1:
        return servers[0]
    first = servers[0]
    merged = PhaseRun(samples_ns=first.samples_ns[:warmup], staging_ns=first.staging_ns[:warmup],
                      disturbance=next((run.disturbance for run in servers  # the worst's: a disturbed server fails it
                                        if run.disturbance is not None and run.disturbance.too_disturbed), first.disturbance))
    for j in range(sum(len(run.samples_ns) - warmup for run in servers)):
        run, k = servers[j % len(servers)], warmup + j // len(servers)
        merged.samples_ns.append(run.samples_ns[k])
        merged.staging_ns.append(run.staging_ns[k])
    return merged


def _no_timers_left(candidate: Session) -> bool:
    """Whether the frozen candidate left no timer to go off in the next round (else it fails, a guard).

    Its process is frozen, but a POSIX timer or a timerfd it armed still expires: the kernel takes
    each expiry's interrupt on the timed CPU, inside the next round, a baseline's (corpus
    timers_into_next_round: thousands of them). A server has no use for one.
    """
    left = timers_left(candidate.server.pids())
    if left:
        failed = RoundsFailed("guard", f"rejected: [timer] {left}")
        failed.violations = [{"guard": "timer", "reason": left}]
        candidate.failure = failed
    return not left


def timers_left(pids: set[int]) -> str:
    """The POSIX timers and timerfds that ``pids`` hold, described; "" when they hold none."""
    posix = timerfds = 0
    for pid in filter(_leader, pids):  # timers are a process's: its threads list the same ones
        try:
            with open(f"/proc/{pid}/timers") as listing:
                posix += sum(line.startswith("ID:") for line in listing)  # not "ClockID:"
            timerfds += sum(_link(pid, fd) == "anon_inode:[timerfd]" for fd in os.listdir(f"/proc/{pid}/fd"))
        except OSError:  # the process is gone
            continue
    held = [f"{n} {what}" for n, what in ((posix, "POSIX timer(s)"), (timerfds, "timerfd(s)")) if n]
    return f"left {' and '.join(held)} set after its round, to go off in the next one's" if held else ""


def _link(pid: int, fd: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:  # closed meanwhile
        return ""


def _leader(pid: int) -> bool:
    """Whether ``pid`` leads its thread group (a process, not one of its threads)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return next((line.split()[1] for line in status if line.startswith("Tgid:")), "") == str(pid)
    except OSError:
        return False


def _runs_of(session: Session) -> dict[str, PhaseRun]:
    """A baselines' server's runs, or why it failed, raised as BaselinesFailed."""
    try:
        runs, _ = session.finish()
    except Exception as err:
        kind = getattr(err, "kind", type(err).__name__)
        raise BaselinesFailed(f"the baselines failed ({kind}): {err}", getattr(err, "output", "")) from err
    return runs


def _baselines_failure(baselines: list[Session]) -> BaselinesFailed:
    """Why the baselines' servers failed, from the first one that did."""
    for session in (s for s in baselines if not s.ok):
        try:
            _runs_of(session)
        except BaselinesFailed as err:
            return err
    return BaselinesFailed("the baselines failed: a server stopped before its rounds were done")
