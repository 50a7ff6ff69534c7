"""The environment's pure parts: results round trip, verification rules, milestone reward."""
from __future__ import annotations

import pytest
import torch

from configs.schema import RewardConfig
from env_pool.reward import apply_reward, drift, stretch_drift
from env_pool.trusted.round_protocol import pooled
from env_pool.trusted import verify
from env_pool.trusted.verify import Variation, check_outputs
from protocol.results import EvalResult, InputCheck, Milestone, Timing, Violation
from tasks.task import Task

TASK = Task(id="t", level=1, source="")


def rounds(median: float, spread: float = 0.0, n: int = 30) -> Timing:
    """``n`` timed rounds evenly spread over ``median`` +- ``spread`` (a fraction of it), in a
    shuffled order: no drift from the first rounds to the last."""
    samples = [median * (1 + spread * (2 * k / (n - 1) - 1)) for k in range(n)]
    return Timing(median, median * spread, n, [samples[(7 * k) % n] for k in range(n)])


def timed(eager: float, compiled: float, candidate: float, spread: float = 0.0) -> EvalResult:
    return EvalResult("t", "cpp", checks=[InputCheck(0, True)], eager=rounds(eager, spread),
                      compiled=rounds(compiled, spread), candidate=rounds(candidate, spread))


def test_eval_result_round_trips_through_msgpack():
    result = timed(2.0, 1.5, 1.0)
    result.violations = [Violation("tamper", "torch.allclose was replaced")]
    result.eager_recheck = rounds(2.1)
    again = EvalResult.unpack(result.pack())
    assert again == result and again.speedup_vs_eager == 2.0


def test_a_failed_result_cannot_claim_a_milestone():
    with pytest.raises(ValueError, match="cannot reach a milestone"):
        EvalResult("t", "cpp", milestone=Milestone.CORRECT, failure="wrong")
    with pytest.raises(ValueError, match="failure must be one of"):
        EvalResult("t", "cpp", failure="bad luck")


@pytest.mark.parametrize(
    "eager, compiled, candidate, milestone, reward",
    [
        (1.0, 0.8, 2.0, Milestone.CORRECT, 1.0),  # slower than both
        (2.0, 1.0, 1.5, Milestone.FASTER_THAN_EAGER, 2.0),
        (2.0, 1.04, 1.0, Milestone.FASTER_THAN_EAGER, 2.0),  # 4% over compile is inside the 5% margin
        (2.0, 1.2, 1.0, Milestone.FASTER_THAN_COMPILE, 3.0),
    ],
)
def test_milestones_follow_the_paper_schedule(eager, compiled, candidate, milestone, reward):
    result = apply_reward(timed(eager, compiled, candidate), RewardConfig())
    assert (result.milestone, result.reward) == (milestone, reward)


def test_a_speed_milestone_needs_its_interval_to_clear_the_margin_not_just_the_point_estimate():
    quiet = apply_reward(timed(2.0, 1.2, 1.0), RewardConfig())
    noisy = apply_reward(timed(2.0, 1.2, 1.0, spread=0.6), RewardConfig())  # rounds spread +-60% about each median
    assert quiet.milestone == Milestone.FASTER_THAN_COMPILE and quiet.compile_interval[0] > 1.15
    assert noisy.milestone == Milestone.FASTER_THAN_EAGER  # 1.2x compile on the point estimate, not for sure
    low, high = noisy.compile_interval
    assert low <= 1.05 < 1.2 < high and "1.20x torch.compile is not a sure win" in noisy.message, noisy.message
    assert noisy.eager_interval[0] > 1.0  # 2x eager survives the same noise


def test_a_machine_whose_speed_shifted_within_the_rounds_gets_a_wider_interval():
    """Measured on the 2-core machine: an eager baseline's rounds at ~3.3 ms, then ~5.2 ms, in one
    phase. Each stretch is steady, so the rounds' bootstrap alone is sure of a ratio that the next
    evaluation, timed in another stretch, contradicts."""
    shifted = Timing(1.0, 0.0, 30, [0.8] * 10 + [1.2] * 20)  # a third of the rounds in a faster stretch
    steady = apply_reward(timed(2.0, 1.3, 1.0), RewardConfig())
    drifted = apply_reward(timed(2.0, 1.3, 1.0), RewardConfig())
    drifted.candidate = shifted
    apply_reward(drifted, RewardConfig())
    assert drift(shifted) == pytest.approx(0.5) and drift(rounds(1.0, spread=0.3)) < 0.1  # shuffled: thirds differ by chance only
    assert steady.milestone == Milestone.FASTER_THAN_COMPILE and steady.compile_interval[0] > 1.2
    assert drifted.milestone == Milestone.FASTER_THAN_EAGER, drifted.message  # 1.3x compile: not for sure
    assert drifted.compile_interval[0] <= 1.3 / 1.5 + 1e-3 and "widened by the 50%" in drifted.message, drifted.message


def test_baselines_pooled_from_two_servers_that_disagree_get_a_wider_interval():
    """The 2-core VM's compiled argmax baseline: 1.21-1.28 ms in one server, 1.47-1.95 ms in another,
    each steady. Pooled in order, the servers' difference is a drift."""
    fast, slow = rounds(1.25, spread=0.05, n=15), rounds(1.7, spread=0.05, n=15)
    both = pooled([fast, slow])
    assert both.repetitions == 30 and both.samples_ms == fast.samples_ms + slow.samples_ms
    assert drift(both) > 0.3 and drift(pooled([fast, rounds(1.26, spread=0.05, n=15)])) < 0.1
    one_server = timed(2.0, 1.7, 1.25)  # the slow server alone: 1.36x torch.compile, sure of itself
    two_servers = timed(2.0, 1.7, 1.25)
    two_servers.compiled = both
    apply_reward(one_server, RewardConfig())
    apply_reward(two_servers, RewardConfig())
    assert one_server.milestone == Milestone.FASTER_THAN_COMPILE
    assert two_servers.milestone == Milestone.FASTER_THAN_EAGER, two_servers.message


def test_rounds_timed_in_turn_are_resampled_by_turn_so_a_drift_shared_by_both_sides_cancels():
    """The 2-core VM's speed moves by 20-50% between stretches of seconds. Timed in turn, a turn's
    rounds share their stretch: a kernel 1.3x faster than torch.compile in every turn is so for sure,
    however far the machine drifted; resampled side by side and widened by the drift, it is not."""
    speed = [1.0 + 0.8 * abs(((k * 37) % 30) / 29 - 0.5) + (0.6 if k >= 15 else 0.0) for k in range(30)]  # noise and a step

    def drifting(ms: float) -> Timing:
        samples = [ms * x for x in speed]
        return Timing(sorted(samples)[15], 0.0, 30, samples)

    def result(in_turn: bool) -> EvalResult:
        r = EvalResult("t", "cpp", checks=[InputCheck(0, True)], eager=drifting(2.0), compiled=drifting(1.3),
                       candidate=drifting(1.0), timed_in_turn=in_turn)
        return apply_reward(r, RewardConfig())

    apart, in_turn = result(False), result(True)
    assert apart.milestone == Milestone.FASTER_THAN_EAGER and apart.compile_interval[0] < 1.05, apart.compile_interval
    assert in_turn.milestone == Milestone.FASTER_THAN_COMPILE, in_turn.message
    assert in_turn.compile_interval == pytest.approx([1.3, 1.3]) and "widened" not in in_turn.message
    # A turn is k-th of each side: shuffled against each other, the same rounds are no sure win.
    shuffled = result(True)
    shuffled.candidate.samples_ms = shuffled.candidate.samples_ms[15:] + shuffled.candidate.samples_ms[:15]
    assert apply_reward(shuffled, RewardConfig()).milestone == Milestone.FASTER_THAN_EAGER, shuffled.compile_interval


def test_a_machine_whose_speed_moved_between_the_baselines_and_the_candidate_gets_a_wider_interval():
    """The baselines cached from one stretch, the candidate timed in another: each steady, so
    neither's own drift shows it. The eager baseline's recheck after the candidate's rounds does:
    on the 2-core machine an argmax kernel got 'faster than torch.compile' in 2 of 10 separate
    evaluations this way, and 'faster than eager' in the other 8."""
    settled = timed(2.0, 1.3, 1.0)
    settled.eager_recheck = rounds(2.02)  # 1% off: the medians' own noise
    moved = timed(2.0, 1.3, 1.0)
    moved.eager_recheck = rounds(2.8)  # the machine 40% slower by the candidate's stretch
    apply_reward(settled, RewardConfig())
    apply_reward(moved, RewardConfig())
    assert stretch_drift(moved) == pytest.approx(0.4) and stretch_drift(timed(2.0, 1.3, 1.0)) == 0.0
    assert settled.milestone == Milestone.FASTER_THAN_COMPILE, settled.message
    assert moved.milestone == Milestone.FASTER_THAN_EAGER, moved.message  # 1.3x compile: not across stretches
    assert "widened by the 40% the machine's speed moved between the baselines' rounds and yours" in moved.message
    assert moved.eager_interval[0] > 1.0  # 2x eager survives it
    # Twice as fast as when the baselines were cached: 2x eager is 1x in the candidate's stretch.
    stale = timed(2.0, 1.3, 1.0)
    stale.eager_recheck = rounds(1.0)
    apply_reward(stale, RewardConfig())
    assert stale.milestone == Milestone.CORRECT and stale.eager_interval[0] <= 1.0 + 1e-3


def test_the_interval_is_the_same_for_the_same_rounds_and_absent_without_them():
    first, again = (apply_reward(timed(2.0, 1.2, 1.0, spread=0.3), RewardConfig()) for _ in range(2))
    assert first.compile_interval == again.compile_interval and first.compile_interval
    bare = EvalResult("t", "cpp", checks=[InputCheck(0, True)], eager=Timing(2.0, 0.0, 9), compiled=Timing(1.2, 0.0, 9),
                      candidate=Timing(1.0, 0.0, 9))  # medians without their rounds (an old record)
    assert apply_reward(bare, RewardConfig()).milestone == Milestone.CORRECT and bare.eager_interval == []


def test_wrong_or_failed_results_get_the_failure_reward():
    wrong = EvalResult("t", "cpp", checks=[InputCheck(0, False, reason="tolerance")])
    assert apply_reward(wrong, RewardConfig(failure=-2.0)).reward == -2.0


def test_verify_rejects_nan_even_where_the_reference_is_close():
    expected = [torch.ones(4)]
    got = [torch.tensor([1.0, float("nan"), 1.0, 1.0])]
    check = check_outputs(0, TASK, expected, got)
    assert not check.passed and "NaN" in check.reason


@pytest.mark.parametrize(
    "got, reason",
    [
        ([torch.ones(4, 1)], "shape"),
        ([torch.ones(4, dtype=torch.float64)], "dtype"),
        ([torch.ones(4) * 1.001], "outside atol"),
        ([torch.ones(4), torch.ones(4)], "returned 2 output"),
    ],
)
def test_verify_names_the_mismatch(got, reason):
    check = check_outputs(0, TASK, [torch.ones(4)], got)
    assert not check.passed and reason in check.reason


def test_verify_accepts_summation_order_differences():
    x = torch.randn(4096, dtype=torch.float64)
    expected = [x.sum().float().reshape(1)]
    got = [x.float().flip(0).cumsum(0)[-1].reshape(1)]
    assert check_outputs(0, TASK, expected, got).passed


@pytest.mark.parametrize("expected, got", [
    ([1.0, float("inf"), float("-inf")], [1.0, float("inf"), float("-inf")]),  # equal infinities are close
    ([1.0, float("inf")], [1.0, 3.0e38]),
    ([1.0, float("inf")], [1.0, float("-inf")]),
    ([float("nan"), 1.0], [0.0, 1.0]),  # a NaN in the reference is never matched
    ([1.0, 2.0], [1.0 + 1.9e-4, 2.0]),  # inside atol + rtol * |expected|
    ([1.0, 2.0], [1.0 + 2.1e-4, 2.0]),  # just outside
    ([0.0, 1e30], [1e-9, 1e30 * (1 + 5e-5)]),
])
def test_verify_decides_as_torch_allclose(expected, got):
    e, g = torch.tensor(expected), torch.tensor(got)
    atol, rtol = TASK.tolerances("float32")
    assert check_outputs(0, TASK, [e], [g]).passed == torch.allclose(g.double(), e.double(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.uint8, torch.bool])
def test_verify_decides_as_torch_allclose_in_every_dtype(dtype):
    base = torch.tensor([0.0, 1.0, 2.0, 100.0])
    for got in (base, base + 1, base * (1 + 2e-3)):  # equal; off by one; off by a half-precision ulp or so
        e, g = base.to(dtype), got.to(dtype)
        atol, rtol = TASK.tolerances(str(dtype).removeprefix("torch."))
        want = torch.allclose(g.double(), e.double(), atol=atol, rtol=rtol)
        assert check_outputs(0, TASK, [e], [g]).passed == want, (dtype, got)


def test_verify_in_pieces_decides_and_counts_as_whole(monkeypatch):
    """An output larger than a piece is compared piece by piece (a 6 GiB output's whole
    difference ran an H100 out of memory): the same verdict, the same count and worst error."""
    e = torch.linspace(-3, 3, 1000)
    g = e.clone()
    g[[5, 400, 999]] += torch.tensor([1.0, -2.0, 0.5])  # wrong in three pieces
    whole = check_outputs(0, TASK, [e], [g])
    monkeypatch.setattr(verify, "CHUNK", 64)
    assert len(verify._pieces(e, g)) == 16
    pieced = check_outputs(0, TASK, [e], [g])
    assert (pieced.passed, pieced.reason, pieced.max_abs_error) == (whole.passed, whole.reason, whole.max_abs_error)
    assert "3 of 1000 values" in pieced.reason and pieced.max_abs_error == pytest.approx(2.0)
    g[700] = float("nan")
    assert check_outputs(0, TASK, [e], [g]).reason == "output contains NaN"
    assert check_outputs(0, TASK, [e], [e.clone()]).passed
    strided = torch.randn(40, 50).t()  # a strided reference is compared whole, as it lies
    assert len(verify._pieces(strided, strided.contiguous())) == 1
    assert check_outputs(0, TASK, [strided], [strided.contiguous()]).passed


def _variation(*sets: list[torch.Tensor], copy: bool = False) -> Variation:
    variation = Variation()
    for outputs in sets:
        variation.add(outputs, copy)
    return variation


def test_constant_outputs_do_not_vary_with_inputs():
    assert not _variation([torch.zeros(3)], [torch.zeros(3)], [torch.zeros(3)]).varies
    assert _variation([torch.zeros(3)], [torch.zeros(3)], [torch.ones(3)]).varies  # any later set differing from the first
    assert _variation([torch.zeros(2), torch.zeros(3)], [torch.zeros(2), torch.ones(3)]).varies  # any output of it


def test_a_variation_copies_the_first_set_where_its_memory_is_reused():
    reused = torch.zeros(3)
    held = Variation()
    held.add([reused], copy=True)
    reused.fill_(1.0)  # the harness's snapshot, overwritten by the next round
    held.add([reused], copy=True)
    assert held.varies
    aliased = Variation()
    aliased.add([reused])
    reused.fill_(2.0)
    aliased.add([reused])
    assert not aliased.varies  # what copy=True is for


def test_adversarial_sets_are_made_when_their_round_asks_and_leave_the_inputs_alone():
    from env_pool.shared.inputs import adversarial

    shared = torch.linspace(-1.0, 1.0, 10_000)  # a get_inputs that hands out one tensor every call
    made = []
    sets = adversarial(lambda: made.append(1) or [shared, 3], seed=5)
    assert made == []  # nothing held before the rounds
    large, tiny, kinks, flipped, shifted = (make() for make in sets)
    assert len(made) == 5 and large[1] == 3 and flipped[1] == 3
    assert torch.equal(large[0], shared * 1e3) and torch.equal(tiny[0], shared * 1e-3)
    zeros = kinks[0] == 0
    assert 0.1 < zeros.float().mean() < 0.3 and torch.signbit(kinks[0][zeros]).any()  # signed zeros, both signs
    assert torch.equal(flipped[0], -shared) and abs(float(shifted[0].mean())) < 1e-6  # sign changes, not only scalings
    assert torch.equal(shared, torch.linspace(-1.0, 1.0, 10_000))


@pytest.mark.gpu
def test_a_large_first_set_waits_in_host_memory_and_is_compared_in_pieces(monkeypatch):
    monkeypatch.setattr(verify, "HELD_ON_DEVICE", 1024)
    monkeypatch.setattr(verify, "CHUNK", 1000)
    out = torch.arange(5000.0, device="cuda")
    held = Variation()
    held.add([out], copy=True)
    assert held.first[0].device.type == "cpu"
    held.add([out.clone()])
    assert not held.varies
    last = out.clone()
    last[4999] += 1.0  # in the last piece only
    held.add([last])
    assert held.varies
    small = Variation()
    small.add([torch.zeros(10, device="cuda")])
    assert small.first[0].is_cuda  # under the limit: kept where it is


@pytest.mark.parametrize("cpus, threads, plan", [
    (list(range(16)), 4, ([0, 1, 2, 3], [4, 5], list(range(6, 16)))),  # the H100 host: the harness keeps two CPUs to itself
    ([0, 1], 1, ([0], [1], [1])),  # this 2-core machine: the harness and the builds share what is left
    ([0, 1, 2, 3], 1, ([0], [1, 2], [3])),
    ([0, 1, 2], 1, ([0], [1, 2], [1, 2])),
])
def test_the_harness_keeps_cpus_of_its_own_where_there_are_enough(monkeypatch, cpus, threads, plan):
    from env_pool import evaluate

    monkeypatch.setattr(evaluate.os, "sched_getaffinity", lambda _: set(cpus))
    got = evaluate.split_cpus(threads)
    assert (got.servers, got.harness, got.builds) == plan


@pytest.mark.parametrize("flags, arch", [
    (["-gencode=arch=compute_90a,code=sm_90a"], "9.0a"),  # what torch picked on the H100 host
    (["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_80,code=compute_80"], "8.0+PTX"),
    (["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90", "-O3"], "8.0;9.0"),
    ([], ""),
])
def test_the_import_childs_architecture_is_read_back_from_torchs_own_gencode_flags(flags, arch):
    from env_pool.build.cuda_arch import arch_list_from_flags

    assert arch_list_from_flags(flags) == arch


@pytest.mark.parametrize("log, needs", [
    ("RuntimeError: No CUDA GPUs are available", True),
    ("RuntimeError: Found no NVIDIA driver on your system.", True),
    ("RuntimeError: Error building extension 'x': ... No CUDA GPUs are available", False),  # its build failed: no second try
    ("SyntaxError: invalid syntax", False),
])
def test_only_an_import_that_wanted_the_device_is_tried_again_with_it(log, needs):
    from env_pool.build.cuda_arch import needs_device

    assert needs_device(log) is needs


NOISY = {"median_ms": 1.5, "iqr_ms": 4.0, "repetitions": 9}  # as CI's 2-core VM timed 03_softmax once: IQR > 2x median
STEADY = {"median_ms": 1.5, "iqr_ms": 0.1, "repetitions": 9}


@pytest.mark.parametrize("verdict, kept, failure", [
    ({"ok": True, "eager": STEADY, "compiled": STEADY}, True, None),
    ({"ok": True, "eager": NOISY, "compiled": STEADY}, False, "infra"),  # a pass needs baselines: measured again
    ({"ok": False, "failure": "wrong", "eager": NOISY, "compiled": STEADY}, False, "wrong"),  # wrong whatever they were
    ({"ok": True, "violations": [{"guard": "torch_fallback", "reason": "x"}], "eager": NOISY, "compiled": NOISY}, False, None),
])
def test_implausible_baselines_are_never_cached_and_fail_only_a_candidate_that_needs_them(verdict, kept, failure):
    from env_pool.evaluate import EvalContext, keep_baselines

    ctx = EvalContext(cfg=None)
    judged = keep_baselines(ctx, ("t", "cpp"), verdict)
    assert (("t", "cpp") in ctx.baselines) is kept
    assert judged.get("failure") == failure
    assert judged.get("violations") == verdict.get("violations")  # a guard's finding survives to be judged


def test_the_cpu_cache_flush_writes_twice_the_largest_cache_at_most_the_gpus_amount():
    from pathlib import Path

    from env_pool.shared.profile import FLUSH_BYTES, flush_bytes

    sizes = [s.read_text().strip() for s in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size")]
    largest = max((int(s[:-1]) << {"K": 10, "M": 20}[s[-1]] for s in sizes), default=0)
    assert flush_bytes("cuda") == FLUSH_BYTES
    assert flush_bytes("cpu") == (min(FLUSH_BYTES, 2 * largest) if largest else FLUSH_BYTES)
    assert flush_bytes("cpu") >= 2 * largest, "the flush evicts the last-level cache"


def test_the_compiled_baseline_is_compiled_before_its_phase_is_ready_and_not_again_in_its_rounds(tmp_path):
    """torch.compile in the first warm-up round kept the waiting servers paused through it (and timed nothing)."""
    from torch._dynamo.utils import counters

    from env_pool.candidate import serve
    from env_pool.shared.rounds import plan_layout
    from tasks.loader import load_tasks
    from tasks.task import build_problem

    task = {t.id: t for t in load_tasks()[0]}["level1/01_gelu"]
    problem = build_problem(task, "cpp")
    args = [torch.randn(*a.shape) for a in problem.get_inputs()]
    layout = plan_layout(args, [torch.empty_like(args[0])], "cpu")
    torch._dynamo.reset()
    counters.clear()
    payload = {"init_seed": 1, "compile_mode": "default"}
    model, armed = serve.build_phase("compiled", payload, problem, "cpu", args, layout, None, {})
    compiled = counters["stats"]["unique_graphs"]
    assert armed is None and compiled == 1, f"compiled once in the build: {dict(counters['stats'])}"
    with torch.no_grad():  # as _serve_rounds calls it
        torch.testing.assert_close(model(*args), torch.nn.functional.gelu(args[0]))
    assert counters["stats"]["unique_graphs"] == compiled, "the rounds reuse the build's graph (no recompile)"


def test_a_models_weights_are_made_on_its_device_never_on_the_host_first():
    """level3/2_ShallowWideMLP's 8 GiB of weights built on the host first ran its servers over the memory limit."""
    from env_pool.shared.inputs import make_model
    from tasks.task import build_problem

    source = ("import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    def __init__(self, n):\n"
              "        super().__init__()\n        self.fc = nn.Linear(n, n)\n        self.made_on = self.fc.weight.device.type\n"
              "    def forward(self, x):\n        return self.fc(x)\n"
              "def get_inputs():\n    return [torch.randn(2, 1024)]\ndef get_init_inputs():\n    return [1024]\n")
    problem = build_problem(Task(id="t/wide", level=1, source=source), "cpp")
    model = make_model(problem, 0, "meta")  # made on the meta device, they take no memory at all
    assert model.made_on == "meta" and model.fc.weight.device.type == "meta" and not model.training
