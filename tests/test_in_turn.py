"""Baselines timed in turn with the candidate (env.baseline_timing, env_pool/trusted/in_turn.py), on the cpp backend."""
from __future__ import annotations

import asyncio
import json

import pytest

from configs.schema import EnvConfig
from env_pool.evaluate import EvalContext, evaluate, times_in_turn
from env_pool.trusted import round_protocol
from scripts.profile_harness import InProcessHarness
from tasks.loader import load_tasks
from tests.corpus_cases import CORPUS, files_of


def test_a_full_evaluation_serves_the_candidate_and_its_baselines_one_round_each_per_turn(tmp_path, monkeypatch):
    """Every server built and frozen first; then each turn one round of each, in a rotating order;
    the speedups read turn by turn. Timed apart (cached), the baselines ran seconds before the
    candidate, and the 2-core machine's drift between the stretches decided its milestones."""
    served: list[str] = []
    original = round_protocol.Session._round

    def spy(self, given, check, label):
        served.append(f"{self.phases[-1]}:{self.phases[len(self.runs)]}")  # the server (by its last phase), the phase
        return original(self, given, check, label)

    monkeypatch.setattr(round_protocol.Session, "_round", spy)
    folder = CORPUS / "legit" / "relu_omp"
    task = {t.id: t for t in load_tasks()[0]}[json.loads((folder / "case.json").read_text())["task"]]
    ctx = EvalContext(cfg=EnvConfig(work_dir=str(tmp_path), warmup=2, repetitions=6, pch_dir="", baseline_timing="in_turn"))
    ctx._harness = inproc = InProcessHarness()
    try:
        result = asyncio.run(evaluate(ctx, task, files_of(folder), "full"))
    finally:
        inproc.close()
    assert result.failure is None, result.message
    assert result.timed_in_turn and all(len(t.samples_ms) == 6 for t in (result.eager, result.compiled, result.candidate))
    timed = served[-3 * 8:]  # 2 warm-up and 6 timed turns
    turn = ["candidate:candidate", "compiled:compiled", "eager:eager"]
    assert all(sorted(timed[k:k + 3]) == turn for k in range(0, len(timed), 3)), timed
    assert len({tuple(timed[k:k + 3]) for k in range(0, 9, 3)}) == 3, timed  # the order rotates
    # Before the turns: the baselines' null phases (then their builds), then the candidate's null
    # phase and its checked rounds, alone.
    before = served[:-len(timed)]
    first = before.index("candidate:null")
    assert set(before[:first]) == {"eager:null", "compiled:null"}, before
    assert set(before[first:]) == {"candidate:null", "candidate:candidate"}, before
    assert result.eager_interval and result.compile_interval


@pytest.mark.parametrize("settings, backend, in_turn", [
    ({}, "cpp", True),
    ({}, "cuda", False),
    ({"eager_recheck": True}, "cpp", False),  # asks for cached baselines to recheck
    ({"baseline_servers": 2}, "cpp", False),
    ({"baseline_timing": "cached"}, "cpp", False),
    ({"baseline_timing": "in_turn"}, "cpp", True),
    ({"baseline_timing": "in_turn"}, "cuda", "env.baseline_timing=cached"),
    ({"baseline_timing": "in_turn", "eager_recheck": True}, "cpp", "env.eager_recheck=false"),
])
def test_baselines_are_timed_in_turn_on_cpp_by_default_and_refused_where_that_cannot_hold(settings, backend, in_turn):
    cfg = EnvConfig(**settings, backend=backend)
    if isinstance(in_turn, str):  # refused, naming the fix; when the worker starts, not per evaluation
        with pytest.raises(ValueError, match=in_turn):
            times_in_turn(cfg, backend)
        with pytest.raises(ValueError, match=in_turn):
            EvalContext(cfg=cfg)
    else:
        assert times_in_turn(cfg, backend) is in_turn
