"""The candidate's timed rounds served in turn with its baselines': a round of each, then the next turn.

TRUSTED SIDE (env_pool/trusted/harness.py, under env.baseline_timing=in_turn). Baselines timed
apart from the candidate, in a stretch and a server of their own, decided milestones by which
stretch and which server each evaluation drew: on the 2-core VM the machine's speed moves by
20-50% between stretches of seconds, and ten separate evaluations of one argmax kernel timed its
torch.compile baseline at 1.87-3.05 ms and earned milestones 2 (eight times), 3 and 1. Served
in turn, a turn's three rounds share their stretch, and env_pool/reward.py resamples whole turns:
the machine's drift moves both sides of a speedup together instead of widening its interval.

Every server is started, built (torch.compile included) and frozen in its timed phase before
the turns begin, so nothing builds beside a timed round; the baselines' servers are built before
the candidate's is taken, so its time limit is not spent on torch.compile. The order within a
turn rotates: no server's round always follows the same other's.

The CPU only (env_pool/evaluate.py refuses it on a GPU): there the candidate's queued work runs
on after its server is frozen, into the next baseline's round, and every server's round
allocates in the one arena of the slot memory.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from env_pool.trusted.harness_request import HarnessRequest
from env_pool.trusted.round_protocol import Phase, PhaseRun, Rounds, Session
from env_pool.trusted.server_pool import ServerPools

BASELINES = ("eager", "compiled")


class BaselinesFailed(Exception):
    """A baselines' server failed: the environment's fault (infra), whatever the candidate did."""

    def __init__(self, message: str, output: str = ""):
        super().__init__(message)
        self.output = output


def serve_in_turn(rounds: Rounds, pools: ServerPools, request: HarnessRequest, phases: list[Phase],
                  timed_set: Any) -> tuple[dict[str, PhaseRun], dict, dict[str, dict[str, PhaseRun]]]:
    """The candidate's two phases (null; its rounds, whose last warmup + repetitions are timed), each
    timed round in a turn with one round of each baseline on ``timed_set``: (the candidate's runs,
    its server's report, each baseline's runs by name). The candidate's failure is raised as
    RoundsFailed; a baselines' server's, when the candidate's own rounds did not fail, as BaselinesFailed."""
    turns = request.warmup + request.repetitions
    (_, null, _, _), (_, todo, _, labels) = phases
    checked = len(todo) - turns
    with contextlib.ExitStack() as held:  # every server stopped and released, whatever fails
        baselines = [held.enter_context(Session(rounds, pools, ["null", name], Path(request.reference_cwd), trusted=True))
                     for name in BASELINES]
        for session in baselines:  # both started before either's null rounds: no start-up beside them
            session.begin(len(null))
        for session in baselines:
            _null_then_begin(session, pools, null, turns)
        if not all(session.ok for session in baselines):
            raise _baselines_failure(baselines)
        candidate = held.enter_context(Session(rounds, pools, ["null", "candidate"], Path(request.scratch), trusted=False))
        if candidate.begin(len(null)) and _null_then_begin(candidate, pools, null, len(todo)):
            with pools.quiet(True):
                candidate.serve(todo[:checked], True, labels[:checked])
                _turns(candidate, baselines, todo[checked:], labels[checked:], timed_set)
        for session in [candidate, *baselines]:
            session.end()
        if not candidate.ok or all(session.ok for session in baselines):
            runs, report = candidate.finish()  # raises the candidate's own failure
        else:
            raise _baselines_failure(baselines)
        return runs, report, {name: _runs_of(session) for name, session in zip(BASELINES, baselines)}


def _null_then_begin(session: Session, pools: ServerPools, null: list, count: int) -> bool:
    """The null phase's rounds, then the next phase begun (its model built) with ``count`` rounds; whether all went well."""
    with pools.quiet(True):
        session.serve(null, False)
    return session.end() and session.begin(count)


def _turns(candidate: Session, baselines: list[Session], todo: list, labels: list[str], timed_set: Any) -> None:
    """One round of each server per turn, the order rotated each turn; stops at the first failure."""
    servers = [candidate, *baselines]
    for turn, (given, label) in enumerate(zip(todo, labels)):
        for session in servers[turn % len(servers):] + servers[:turn % len(servers)]:
            served = session.serve([given], True, [label]) if session is candidate else session.serve([timed_set], False)
            if not served:
                return


def _runs_of(session: Session) -> dict[str, PhaseRun]:
    try:
        runs, _ = session.finish()
    except Exception as err:
        raise BaselinesFailed(f"the baselines failed: {err}", getattr(err, "output", "")) from err
    return runs


def _baselines_failure(baselines: list[Session]) -> BaselinesFailed:
    """Why the baselines' servers failed, from the first one that did."""
    for session in baselines:
        if not session.ok:
            try:
                session.finish()
            except Exception as err:
                kind = getattr(err, "kind", type(err).__name__)
                return BaselinesFailed(f"the baselines failed ({kind}): {err}", getattr(err, "output", ""))
    return BaselinesFailed("the baselines failed: a server stopped before its rounds were done")
