"""The report's arithmetic, on records built in the open (the sweep tests check it end to end)."""
from __future__ import annotations

import math
from itertools import combinations

import pytest

from launch.eval_report import P_GRID, pass_at_k, render_markdown, summarize


def record(task: str, level: int, milestone: int, speedup_compile: float | None = None, failure: str | None = None,
           sample: int = 0, solution_hash: str | None = None, speedup_eager: float | None = None) -> dict:
    return {"episode_id": f"{task}-s{sample}", "task_id": task, "level": level, "sample": sample, "milestone": milestone,
            "failure": failure, "message": "", "violations": [], "speedup_compile": speedup_compile,
            "speedup_eager": speedup_eager or speedup_compile, "stop_reason": "submit", "turns": 3, "generated_tokens": 10,
            "solution": None, "solution_hash": solution_hash}


def test_pass_at_k_is_the_exact_chance_that_k_of_n_samples_hold_a_correct_one():
    for n, c, k in [(5, 2, 1), (5, 2, 3), (10, 1, 5), (4, 0, 2), (4, 4, 4)]:
        outcomes = [True] * c + [False] * (n - c)
        draws = list(combinations(outcomes, k))
        assert pass_at_k(n, c, k) == pytest.approx(sum(any(d) for d in draws) / len(draws)), (n, c, k)


def test_rates_geomeans_and_max_autotune_are_counted_as_the_report_says():
    records = [record("a", 1, 3, 2.0, solution_hash="ha"), record("b", 1, 1, 0.5, solution_hash="hb"),
               record("c", 2, 0, failure="wrong"), record("d", 2, 2, 1.02, solution_hash="hd")]
    autotune = [{"solution_hash": "ha", "milestone": 1, "speedup_compile": 0.8, "failure": None}]
    s = summarize(records, [], autotune, [1], True)
    o = s["groups"]["overall"]
    assert o["pass"] == 0.75 and o["fast1_compile"] == 0.5 and o["faster_compile_env"] == 0.25
    assert o["geomean_compile_correct"] == pytest.approx((2.0 * 0.5 * 1.02) ** (1 / 3))
    assert o["geomean_compile_all"] == pytest.approx((2.0 * 0.5 * 1.0 * 1.02) ** (1 / 4)), "a failure counts as 1.0x"
    assert o["fast1_max_autotune"] == 0.0, "a's 2x over default is 0.8x over max-autotune; b and d were never re-timed"
    assert o["fast_p"]["speedup_compile"][0] == o["pass"], "fast_0 is the pass rate"
    assert o["fast_p"]["speedup_compile"][P_GRID.index(1.5)] == 0.25
    assert s["groups"]["level 2"]["failures"] == {"wrong": 1}
    assert [p["task_id"] for p in s["problems"]] == ["a", "b", "c", "d"]


def test_without_max_autotune_timings_the_report_says_not_measured_and_why():
    s = summarize([record("a", 1, 3, 2.0)], [], [], [1], False)
    assert s["groups"]["overall"]["fast1_max_autotune"] is None
    md = render_markdown(s, {"policy": "p", "backend": "cpp", "max_turns": 200, "compile_mode": "default"}, False)
    assert "| fast_1 vs torch.compile (max-autotune) | not measured | not measured |" in md
    assert "eval.max_autotune=false" in md


def test_best_solution_is_the_highest_milestone_then_the_fastest():
    records = [record("a", 1, 2, 0.9, sample=0), record("a", 1, 3, 1.3, sample=1), record("a", 1, 3, 1.6, sample=2)]
    [row] = summarize(records, [], [], [1, 2, 5], False)["problems"]
    assert (row["best_milestone"], row["speedup_compile"], row["passed"], row["samples"]) == (3, 1.6, 3, 3)
    assert summarize(records, [], [], [1, 2, 5], False)["groups"]["overall"]["pass_at_k"] == {1: 1.0, 2: 1.0}
    assert not math.isnan(summarize(records, [], [], [1], False)["groups"]["overall"]["geomean_compile_all"])


def test_problems_are_listed_by_level_then_kernelbench_number():
    records = [record(t, level, 1, 1.0) for t, level in
               (("100_HingeLoss", 1), ("10_3D", 1), ("2_Standard", 1), ("notes", 1), ("1_Conv", 2), ("19_ReLU", 1))]
    rows = summarize(records, [], [], [1], False)["problems"]
    assert [r["task_id"] for r in rows] == ["2_Standard", "10_3D", "19_ReLU", "100_HingeLoss", "notes", "1_Conv"]
