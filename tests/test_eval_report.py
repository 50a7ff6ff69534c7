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
    assert "| fast_1 vs torch.compile (max-autotune) | not measured |" in md  # one level: its column alone
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


def scored(task: str, level: int, milestone: int, speedup: float | None, noise: float | None, failure: str | None = None) -> dict:
    """A record of `cuda-agent eval --solutions`: no policy, so no turns and no tokens."""
    return {**record(task, level, milestone, speedup, failure, speedup_eager=speedup), "stop_reason": "solution",
            "turns": 0, "generated_tokens": 0, "noise": noise}


CPU_SWEEP = {"policy": "solutions:/tmp/sols", "backend": "cpp", "max_turns": 200, "compile_mode": "default",
             "machines": ["AMD EPYC (2 CPUs)"]}


def test_a_sweep_of_scored_solutions_shows_no_turns_tokens_or_turn_budget():
    s = summarize([scored("01_gelu", 1, 1, 0.9, 0.05), scored("02_swish", 1, 0, None, None, "compile_error")], [], [], [1],
                  False)
    md = render_markdown(s, CPU_SWEEP, False)
    for meaningless in ("turns: mean / max", "generated tokens", "Why episodes ended", "pass@1", "pass (any sample)"):
        assert meaningless not in md, f"{meaningless!r} means nothing in a sweep of scored solutions:\n{md}"
    setting = md.splitlines()[2]
    assert "turns" not in setting, f"a turn budget means nothing without a policy: {setting}"
    assert "scored existing solutions (no policy)" in md and "| problems / solutions | 2 / 2 |" in md
    policy_md = render_markdown(summarize([record("a", 1, 1, 1.0)], [], [], [1], False), {**CPU_SWEEP, "policy": "vllm:x"}, False)
    assert "turns: mean / max" in policy_md and "up to 200 turns" in policy_md.splitlines()[2], "an agent's sweep keeps them"


def test_problems_carry_their_level_and_noisy_speedups_are_marked():
    s = summarize([scored("01_gelu", 1, 1, 0.08, 0.87), scored("03_softmax", 1, 2, 1.5, 0.05)], [], [], [1], False)
    assert [p["problem"] for p in s["problems"]] == ["level1/01_gelu", "level1/03_softmax"]
    md = render_markdown(s, CPU_SWEEP, False)
    gelu = next(line for line in md.splitlines() if line.startswith("| level1/01_gelu |"))
    softmax = next(line for line in md.splitlines() if line.startswith("| level1/03_softmax |"))
    assert "0.08x (noisy)" in gelu and "| 87% |" in gelu, gelu
    assert "1.50x |" in softmax and "noisy" not in softmax, softmax
    assert "| correct with noisy timings (IQR >= 20% of median) | 1 of 2 |" in md
    assert "Noisy timings: 1 of the 2 correct solutions" in md


def test_the_paper_is_beside_a_sweep_only_with_the_conditions_of_each():
    s = summarize([scored("01_gelu", 1, 1, 0.9, 0.05)], [], [], [1], False)
    cpu = render_markdown(s, CPU_SWEEP, False)
    assert "- The paper: KernelBench levels 1-3, CUDA kernels written by the paper's trained agent" in cpu
    assert ("- This sweep: 1 problem(s) of level 1, C++ kernels (backend cpp) from existing solutions (no policy), timed on "
            "AMD EPYC (2 CPUs)") in cpu
    assert "Not comparable: the paper's kernels ran on an H100 GPU" in cpu
    assert "DESIGN.md" not in cpu and "issue 14" not in cpu, "no document or issue outside the report to chase"
    gpu = render_markdown(s, {**CPU_SWEEP, "backend": "cuda", "machines": ["NVIDIA H100 80GB HBM3"]}, False)
    assert "Not comparable" not in gpu and "CUDA kernels from existing solutions" in gpu and "NVIDIA H100" in gpu


def test_the_reports_plots_draw_only_what_the_sweep_measured():
    import base64
    import io

    from matplotlib.image import imread

    from launch.eval_report import plots

    clean = summarize([scored("01_gelu", 1, 1, 0.9, 0.05)], [], [], [1], False)
    images = plots(clean, comparable=False)
    assert "failures_turns" not in images, "no failure and no turns: the empty 'failure kinds' box and a bar at 0 turns"
    assert set(images) == {"rates", "fast_p"}
    failing = summarize([scored("01_gelu", 1, 1, 0.9, 0.05), scored("02_swish", 1, 0, None, None, "compile_error")],
                        [], [], [1], False)
    assert "failures_turns" in plots(failing, comparable=False), "a failure kind is worth a plot"
    for image in plots(failing).values():
        assert imread(io.BytesIO(base64.b64decode(image))).shape[0] > 100  # a drawn PNG


def test_the_report_names_its_rule_set_and_each_speedups_interval():
    """A number means little without the game it was scored under: the paper's rules (1e-2, cuBLAS
    allowed) count kernels correct that ours (1e-4, no library) fail, and a speed milestone is
    decided by the speedup's interval, not the ratio of medians alone."""
    r = {**scored("03_softmax", 1, 2, 1.5, 0.05), "interval_eager": [1.21, 1.84], "interval_compile": [1.2, 1.8]}
    s = summarize([r], [], [], [1], False)
    strict = render_markdown(s, {**CPU_SWEEP, "rules": "strict", "confidence": 0.95, "baseline_timing": "in_turn"}, False)
    setting = strict.splitlines()[2]
    assert "rules strict: float32 outputs within 1e-4" in setting and "at 95% confidence" in setting, setting
    assert "baselines timed in turn with each candidate" in setting, setting
    softmax = next(line for line in strict.splitlines() if line.startswith("| level1/03_softmax |"))
    assert "1.50x [1.21-1.84]" in softmax and "1.50x [1.20-1.80]" in softmax, softmax
    assert "under the strict rules" in strict
    gpu = {**CPU_SWEEP, "backend": "cuda", "machines": ["NVIDIA H100 80GB HBM3"]}
    assert "Stricter than the paper's game" in render_markdown(s, {**gpu, "rules": "strict"}, False)
    paper = render_markdown(s, {**gpu, "rules": "paper"}, False)
    assert "rules paper: outputs within atol = rtol = 1e-2" in paper and "under the paper's rules" in paper
    assert "Stricter" not in paper and "Not comparable" not in paper


def test_a_sweep_folder_refuses_results_under_other_rules_and_resumes_one_from_before_rule_sets(tmp_path):
    import json

    from configs.load import ConfigError
    from launch.sweep_records import SWEEP, check_identity

    identity = {"policy": "vllm:x", "backend": "cpp", "max_turns": 200, "compile_mode": "default", "rules": "strict",
                "confidence": 0.95, "baseline_timing": "cached"}
    check_identity(tmp_path, identity)
    with pytest.raises(ConfigError, match="rules: 'strict' there, 'paper' now"):
        check_identity(tmp_path, {**identity, "rules": "paper"})
    with pytest.raises(ConfigError, match="baseline_timing: 'cached' there, 'in_turn' now"):
        check_identity(tmp_path, {**identity, "baseline_timing": "in_turn"})
    # recorded before env.rules and env.baseline_timing existed: strict, cached
    old = {k: v for k, v in identity.items() if k not in ("rules", "baseline_timing")}
    (tmp_path / SWEEP).write_text(json.dumps(old))
    check_identity(tmp_path, identity)
    # A report of a folder made before the speed interval describes it as it was made, and is not refused.
    from launch.sweep_records import recorded_identity

    older = {k: v for k, v in old.items() if k != "confidence"}
    (tmp_path / SWEEP).write_text(json.dumps(older))
    with pytest.raises(ConfigError, match="confidence: None there"):
        check_identity(tmp_path, identity)
    assert recorded_identity(tmp_path, identity) == {**older, "rules": "strict", "baseline_timing": "cached"}
