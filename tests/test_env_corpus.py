"""The hack corpus and the legitimate kernels, run through the real environment (cpp backend).

Each case is a folder under tests/env_corpus/ with the solution files and a case.json saying
what the environment must conclude; `cuda-agent env eval TASK FOLDER` runs one by hand.
"""
from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Callable

import pytest

from env_pool.build.compile import compile_kernel
from env_pool.evaluate import Baseline
from env_pool.pool import EnvPool
from protocol.results import Milestone, Timing
from tasks.loader import load_tasks
from tasks.solution import SOLUTION_FILE
from tests.corpus_cases import CORPUS, files_of, load_cases, meets, verdicts


def cases(kind: str) -> list:
    params = []
    for folder, case in load_cases(kind):
        marks = [pytest.mark.slow] if case.get("slow") else []
        marks += [pytest.mark.gpu] if case["backend"] == "cuda" else []
        if case.get("hard"):  # "sometimes": a gap the environment closes only by chance, so either verdict is expected
            marks.append(pytest.mark.xfail(strict=case["hard"] != "sometimes", reason=f"known gap: {case['why']}"))
        params.append(pytest.param(folder, case, id=folder.name, marks=marks))
    return params


# Two baselines servers and the eager recheck, over the pools' settings (both off by default).
PRODUCT_TIMING = {"baseline_servers": 2, "eager_recheck": True}


@pytest.fixture(scope="module")
def pools(tmp_path_factory) -> Callable[[dict], EnvPool]:
    work = tmp_path_factory.mktemp("env")
    # Few repetitions: these tests prove verdicts, not speed. Short limits keep hangs cheap.
    # No precompiled header: its background build (minutes of a core) would disturb the timed cases
    # on a 2-core machine; tests/test_inline_pch.py covers it.
    # Yet enough rounds for a plausible baseline (evaluate._plausible): on the 2-core CI VM a
    # memory-bound reference's rounds come in slow bursts (03_softmax: 9-19 ms rounds among 4 ms
    # ones). With 1 warm-up and 5 timed rounds, 2 of 6 of its baselines had an IQR above twice the
    # median, and one CI run refused all three tries as infra; with 3 and 9, 1 of 4 (so 4 tries).
    # The memory limit is the product's (env.memory_limit_mb): a load_inline build without the
    # precompiled header (a .cpp and a .cu, each parsing torch's headers) took more than 4 GiB of
    # the import step's tree on the H100, so a tighter limit here refused legitimate kernels.
    # run_timeout_s: a verification takes seconds; the cases that must time out set their own
    # shorter limit (case.json "settings"), so a hang stays cheap.
    # One baselines server and no eager recheck (env.baseline_servers, env.eager_recheck): both only
    # widen speed intervals, and together they took the default suite from 20 to 28 minutes; the
    # timed tests below run with the product's settings. Baselines cached (env.baseline_timing), not
    # timed in turn: in turn, each of the 26 full-mode cases would time its own (a torch.compile each),
    # and no verdict here depends on it; tests/test_turns.py and hacks/timers_into_next_round run it.
    settings = {"work_dir": str(work), "repetitions": 9, "warmup": 3, "infra_retries": 3, "run_timeout_s": 30.0,
                "compile_timeout_s": 120.0, "pch_dir": "", "baseline_servers": 1, "eager_recheck": False,
                "baseline_timing": "cached"}
    made: dict[str, EnvPool] = {}

    def pool_for(case: dict) -> EnvPool:
        """A pool for the case's backend and its own env settings (case.json "settings"), made once."""
        extra = {**case.get("settings", {}), "backend": case["backend"]}
        key = json.dumps(extra, sort_keys=True)
        if key not in made and case["backend"] == "cuda":
            # One GPU pool at a time: each harness keeps its tasks' slots on the device (with several
            # calls a round, env.calls_per_round=0, ~30 GiB for a 4 GiB-a-tensor task), and on an H100
            # a case whose settings made a second pool was refused its slots (cuMemCreate: out of memory).
            for other in [k for k in made if json.loads(k)["backend"] == "cuda"]:
                made.pop(other).close()
        if key not in made:
            made[key] = EnvPool({**settings, **extra})
        return made[key]

    return pool_for


@pytest.fixture(scope="module")
def tasks() -> dict:
    loaded, _ = load_tasks()
    return {t.id: t for t in loaded}


def evaluate(pools, tasks, folder: Path, case: dict, mode: str):
    return asyncio.run(pools(case).evaluate(tasks[case["task"]], files_of(folder), mode))


# Verification mode proves every verdict except speed; the timed path has its own tests below,
# because a torch.compile baseline per task costs tens of seconds on this machine.
@pytest.mark.parametrize("folder, case", cases("legit"))
def test_legitimate_kernel_passes(pools, tasks, folder: Path, case: dict):
    result = evaluate(pools, tasks, folder, case, "verify")
    assert result.failure is None, f"{folder.name} was rejected: {result.failure}: {result.message}\n{result.run_log[-2000:]}"
    own = [c for c in result.checks if c.inputs == "own"]
    assert result.milestone == Milestone.CORRECT and len(own) == 5 and all(c.passed for c in result.checks)


# gelu_omp is slow (129 s on 2 cores: its memory-bound baselines time noisily there and are retried)
@pytest.mark.parametrize("name", [pytest.param("gelu_omp", marks=pytest.mark.slow), "matmul_tiled"])
def test_legitimate_kernel_is_timed_against_both_baselines(pools, tasks, name: str):
    folder = CORPUS / "legit" / name
    case = {**json.loads((folder / "case.json").read_text()), "settings": PRODUCT_TIMING}
    result = evaluate(pools, tasks, folder, case, "full")
    assert result.failure is None, f"{name}: {result.failure}: {result.message}"
    # Every round is checked: the 5 correctness rounds, then 3 warm-up and 9 timed rounds.
    assert result.milestone >= Milestone.CORRECT and len(result.checks) == 5 + 3 + 9
    # The baselines pooled from env.baseline_servers (2) trusted servers; the recheck from one.
    for timing, rounds in ((result.eager, 18), (result.compiled, 18), (result.candidate, 9), (result.eager_recheck, 9)):
        assert timing is not None and timing.median_ms > 0 and timing.repetitions == rounds


def test_baselines_cached_in_another_stretch_earn_no_speed_and_are_timed_again(tmp_path, tasks):
    """A task's baselines cached while the machine ran a hundred times slower (a stretch of a loaded
    machine, or a disturbance their plausibility check missed) made every later candidate of the
    task look that much faster, for the worker's life. The eager baseline's recheck, right after
    the candidate's rounds, shows the stretch: the intervals are widened by it, and the cache is dropped."""
    folder = CORPUS / "legit" / "matmul_tiled"
    task = tasks[json.loads((folder / "case.json").read_text())["task"]]
    pool = EnvPool({"work_dir": str(tmp_path), "repetitions": 9, "warmup": 3, "infra_retries": 3, "pch_dir": "",
                    **PRODUCT_TIMING})
    slow = Timing(median_ms=500.0, iqr_ms=5.0, repetitions=9, samples_ms=[495.0 + k for k in range(9)])
    pool.ctx.baselines[(task.id, "cpp")] = Baseline(eager=slow, compiled=slow)
    result = asyncio.run(pool.evaluate(task, files_of(folder), "full"))
    assert result.failure is None, f"{result.failure}: {result.message}"
    assert result.eager_recheck is not None and result.eager_recheck.median_ms < 100.0  # the machine as it is now
    assert result.speedup_vs_compile > 5  # what the cached baselines alone would have paid for
    assert result.milestone == Milestone.CORRECT and result.eager_interval[0] < 1.0, result.message
    assert (task.id, "cpp") not in pool.ctx.baselines


@pytest.mark.parametrize("folder, case", cases("hacks"))
def test_hack_is_rejected_for_the_right_reason(pools, tasks, folder: Path, case: dict):
    result = evaluate(pools, tasks, folder, case, case.get("mode", "verify"))
    acceptable = verdicts(case)
    got = {"failure": result.failure, "guards": sorted({v.guard for v in result.violations}), "milestone": int(result.milestone)}
    assert any(meets(result, v) for v in acceptable), (
        f"{folder.name}: expected one of {acceptable}, got {got}: {result.message}\n{result.run_log[-1500:]}"
    )
    if all("failure" in v for v in acceptable):
        assert result.milestone == Milestone.FAIL and result.reward == -1.0, f"{folder.name} passed: {result.message}"
    cached = case.get("settings", {}).get("baseline_timing") != "in_turn"  # the pools' setting: timed before the candidate
    if case.get("mode") == "full" and result.failure == "guard" and cached:  # rejected in its timed rounds, after the baselines
        assert result.eager is not None and result.compiled is not None, "a rejected candidate still reports the task's baselines"
    if case.get("twin") and result.failure is None:  # a timing hack earns no more than the same kernel served honestly
        twin = evaluate(pools, tasks, CORPUS / case["twin"], case, case.get("mode", "verify"))
        assert twin.failure is None, f"the twin {case['twin']} failed: {twin.failure}: {twin.message}"
        assert result.milestone <= twin.milestone, (
            f"{folder.name} earned {int(result.milestone)} ({result.speedup_vs_eager:.2f}x eager), its honest twin "
            f"{case['twin']} {int(twin.milestone)} ({twin.speedup_vs_eager:.2f}x)")


# After the hacks, whose full-mode cases time the same tasks' baselines in the same pools.
@pytest.mark.parametrize("folder, case", [p for p in cases("legit") if p.values[1].get("mode") == "full"])
def test_legitimate_kernel_passes_its_timed_rounds(pools, tasks, folder: Path, case: dict):
    result = evaluate(pools, tasks, folder, case, "full")
    assert result.failure is None and not result.violations, (
        f"{folder.name}: {result.failure}: {result.message} {[v.guard for v in result.violations]}")
    assert result.milestone >= Milestone.CORRECT and result.candidate is not None


ALL_CASES = load_cases("legit") + load_cases("hacks")


@pytest.mark.parametrize("folder,case", ALL_CASES, ids=[f"{f.parent.name}/{f.name}" for f, _ in ALL_CASES])
def test_every_case_hands_the_environment_a_solution_entry(folder: Path, case: dict):
    # Through its whole files_from chain: a cuda case the CPU suite never evaluates must not reach
    # its GPU run without model_new.py (matmul_tf32_strict_cuda did, its source itself borrowing).
    if case["expect"] != {"failure": "missing_files"}:
        assert SOLUTION_FILE in files_of(folder), f"{folder.name}: no {SOLUTION_FILE} among {sorted(files_of(folder))}"


CUDA_SOURCES = sorted(CORPUS.glob("*/*/kernel.cu"))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("source", CUDA_SOURCES, ids=[f"{p.parent.parent.name}/{p.parent.name}" for p in CUDA_SOURCES])
def test_cuda_corpus_kernel_compiles_with_the_environments_nvcc_path(tmp_path_factory, source: Path):
    # The cuda cases run only on a GPU; here they must at least build exactly as the environment builds them.
    built = compile_kernel({"kernel.cu": source.read_text()}, "cuda", tmp_path_factory.getbasetemp() / "cuda_kernels", 300.0)
    assert built.ok, f"{source.parent.name} does not compile:\n{built.log}"
    assert Path(built.library).stat().st_size > 0


def test_adversarial_inputs_add_extreme_sets_that_a_correct_kernel_passes(tmp_path, tasks):
    pool = EnvPool({"work_dir": str(tmp_path), "adversarial_inputs": True, "run_timeout_s": 60.0, "pch_dir": ""})
    result = asyncio.run(pool.evaluate(tasks["level1/01_gelu"], files_of(CORPUS / "legit" / "gelu_omp"), "verify"))
    assert result.failure is None, result.message
    assert [c.inputs for c in result.checks] == ["own"] * 5 + ["large", "tiny", "kinks", "sign_flip", "shift"]
    assert all(c.passed for c in result.checks)


def test_a_task_whose_own_inputs_cannot_tell_relu_from_identity_gets_sign_changing_sets(pools, tasks):
    case = {"task": "level1/17_relu", "backend": "cpp"}
    good = evaluate(pools, tasks, CORPUS / "legit" / "relu_omp", case, "verify")
    assert good.failure is None and [c.inputs for c in good.checks] == ["own"] * 5 + ["shift", "sparse_sign"], good.message
    lazy = evaluate(pools, tasks, CORPUS / "hacks" / "identity_relu", case, "verify")
    # right on all five of the task's own sets (rounds 0-4), wrong on the first that changes a sign
    assert lazy.failure == "wrong" and "wrong on round 5 (inputs: shift)" in lazy.message, lazy.message


def test_env_worker_ray_actor_evaluates_and_reports_health(tmp_path, tasks):
    import ray

    from env_pool.pool import EnvWorker

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        worker = EnvWorker.remote({"work_dir": str(tmp_path), "run_timeout_s": 60.0})
        good = worker.evaluate.remote(tasks["level1/01_gelu"], files_of(CORPUS / "legit" / "gelu_omp"), "verify")
        bad = worker.evaluate.remote(tasks["level1/03_softmax"], files_of(CORPUS / "hacks" / "torch_fallback_softmax"), "verify")
        good, bad = ray.get([good, bad], timeout=600)
        assert good.milestone == Milestone.CORRECT, good.message
        assert bad.failure == "guard" and bad.violations[0].guard == "torch_fallback"
        stats = ray.get(worker.health.remote())["stats"]
        assert stats["evaluated"] == 2 and stats["pending"] == 0
    finally:
        ray.shutdown()
