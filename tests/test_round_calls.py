"""Timed rounds of several forward calls (env.calls_per_round, env_pool/trusted/round_protocol.py).

A round's fixed cost (the thaw, the server's wake, a cold first launch, the sync) is shared by
its calls. Each call has fresh inputs of its own and every call is checked; the baselines and
the candidate are timed with the same calls a round, the cached baselines' kept for the candidate.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from configs.schema import EnvConfig
from env_pool import evaluate as evaluate_module
from env_pool.evaluate import Baseline, EvalContext, evaluate
from env_pool.trusted import harness, round_protocol
from env_pool.trusted.round_protocol import MAX_CALLS, choose_calls, net_timing
from protocol.results import Timing
from scripts.profile_harness import InProcessHarness
from tasks.loader import load_tasks
from tests.corpus_cases import CORPUS, files_of
from tests.harness_requests import request_for

GIB = 1 << 30


@pytest.mark.parametrize("asked, device, call_ms, call_bytes, outputs, calls", [
    (0, "cpu", 0.1, 1 << 20, 1, 1),  # the CPU: one call a round unless asked
    (0, "cuda", 2.9, 8 * GIB, 1, 2),  # an H100 GELU of 4 GiB a tensor: 16 GiB of rounds hold two calls' inputs and outputs
    (0, "cuda", 2.4, 64 << 20, 1, 5),  # a small GEMM: as many as fill 10 ms
    (0, "cuda", 0.05, 1 << 20, 1, MAX_CALLS),  # a tiny kernel: at most MAX_CALLS
    (0, "cuda", 0.05, 1 << 20, 20, 6),  # 20 outputs a call: the control block's OUTS words bound it
    (0, "cuda", 30.0, 8 * GIB, 1, 1),  # a long kernel needs no more than one
    (3, "cpu", 0.1, 1 << 20, 1, 3),  # asked for: as asked, on any device
])
def test_a_round_has_as_many_calls_as_fill_its_time_within_its_memory(asked, device, call_ms, call_bytes, outputs, calls):
    assert choose_calls(request_for(calls_per_round=asked), device, call_ms, call_bytes, outputs) == calls


def test_more_calls_than_the_outputs_allow_is_refused_with_the_field_named():
    with pytest.raises(RuntimeError, match="env.calls_per_round=40"):
        choose_calls(request_for(calls_per_round=40), "cpu", 1.0, 1 << 20, 20)


def test_a_rounds_time_is_shared_by_its_calls_after_the_protocols_cost():
    timing = net_timing([9_000_000, 10_000_000, 11_000_000], null_staging_ns=[1_000_000], calls=3)
    assert timing.median_ms == pytest.approx(3.0) and timing.calls == 3


def test_a_cached_task_is_laid_out_again_for_the_calls_its_cached_baselines_were_timed_with():
    task = {t.id: t for t in load_tasks()[0]}["level1/17_relu"]
    cache = harness.TaskCache()
    chosen = cache.get(request_for(task, calls_per_round=0))
    assert chosen.calls == 1 and cache.get(request_for(task, calls_per_round=0)) is chosen
    three = cache.get(request_for(task, calls_per_round=3))
    assert three is not chosen and three.calls == 3 and three.layout.calls == 3
    assert len(three.arg_views) == 3 and len({v[0].data_ptr() for v in three.arg_views}) == 3  # a slot set each
    assert cache.get(request_for(task, calls_per_round=0)) is three  # "chosen per task": the one cached serves
    three.close()


def test_a_candidate_compared_with_cached_baselines_is_timed_with_their_calls(tmp_path, monkeypatch):
    """Each round's fixed cost is shared by its calls, so a candidate timed with other calls a round
    than its baselines would be compared unevenly."""
    asked: list[int] = []
    monkeypatch.setattr(evaluate_module, "_quiet_request", lambda ctx, request, limit, quiet: asked.append(request.calls_per_round) or {})
    task = {t.id: t for t in load_tasks()[0]}["level1/17_relu"]
    ctx = EvalContext(cfg=EnvConfig(work_dir=str(tmp_path), pch_dir="", baseline_timing="cached"))
    assert ctx.cfg.calls_per_round == 1  # the default: more calls let a round's calls overlap on the device
    timing = Timing(1.0, 0.1, 5, [1.0] * 5, calls=4)
    ctx.baselines[(task.id, "cpp")] = Baseline(timing, dataclasses.replace(timing))
    for baseline in (False, True):  # compared with the cached ones; timing its own (env.calls_per_round's)
        asyncio.run(evaluate_module._harness(ctx, task, "cpp", "full", baseline, tmp_path, tmp_path))
    assert asked == [4, 1]


@pytest.mark.parametrize("timing", ["cached", "in_turn"])
def test_every_call_of_a_timed_round_is_checked_and_timed_alike_on_both_sides(tmp_path, monkeypatch, timing):
    rounds_served: list[tuple[str, int]] = []
    original = round_protocol.Session._round

    def spy(self, given, check, label, calls):
        rounds_served.append((self.phases[len(self.runs)], calls))
        return original(self, given, check, label, calls)

    monkeypatch.setattr(round_protocol.Session, "_round", spy)
    checked = []
    check = round_protocol.Rounds.check
    monkeypatch.setattr(round_protocol.Rounds, "check", lambda self, run, *args: checked.append(args[-1]) or check(self, run, *args))
    folder = CORPUS / "legit" / "relu_omp"
    task = {t.id: t for t in load_tasks()[0]}[json.loads((folder / "case.json").read_text())["task"]]
    # As the corpus's pools: 3 warm-up and 9 timed rounds, so that a baseline is plausible on a busy 2-core
    # machine, and tried again if it was not (env.infra_retries' work, in env_pool/pool.py).
    cfg = EnvConfig(work_dir=str(tmp_path), warmup=3, repetitions=9, pch_dir="", calls_per_round=2, baseline_timing=timing)
    ctx = EvalContext(cfg=cfg)
    ctx._harness = inproc = InProcessHarness()
    try:
        for _ in range(3):
            rounds_served.clear()
            checked.clear()
            result = asyncio.run(evaluate(ctx, task, files_of(folder), "full"))
            if result.failure != "infra":
                break
    finally:
        inproc.close()
    assert result.failure is None, result.message
    assert result.eager.calls == result.compiled.calls == 2
    assert result.candidate is None or result.candidate.calls == 2  # None: too noisy to compare with, on a busy machine
    candidate = [calls for phase, calls in rounds_served if phase == "candidate"]
    assert candidate[-12:] == [2] * 12 and set(candidate[:-12]) == {1}  # checked rounds make one call, timed ones two
    assert {calls for phase, calls in rounds_served if phase != "candidate"} == {2}  # null and baselines' rounds: two
    assert len(checked) == len(candidate) + 12  # every call checked, each as its round's
    assert checked[-2:] == [len(candidate) - 1] * 2 and [c.index for c in result.checks] == list(range(len(candidate)))
    assert len(result.checks) == len(candidate)  # and recorded once a round
    if timing == "cached":
        assert ctx.baselines[(task.id, "cpp")].eager.calls == 2
