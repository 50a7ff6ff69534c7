"""Verification sets must tell a correct kernel from a trivial one (tasks/discriminate.py)."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from tasks.discriminate import plan, transform_inputs
from tasks.loader import load_task_file
from tasks.screen import screen_task

TOL = lambda dtype: (1e-4, 1e-4)  # noqa: E731


def planned(forward, make):
    return plan(lambda inputs: [forward(*inputs)], make, TOL, seed=3)


def test_relu_of_positive_inputs_needs_a_sign_change_before_identity_fails():
    made = lambda: [torch.rand(64, 256)]  # noqa: E731  (KernelBench level1/19_ReLU's torch.rand)
    sets = planned(torch.relu, made)
    assert sets.ok and sets.needed == ["shift"], sets  # relu(x) == x on every positive set: a kernel returning x passed
    assert sets.guards == ["sparse_sign"]  # and a set with scattered negatives, against kernels that probe for them
    own = plan(lambda inputs: [torch.relu(*inputs)], made, TOL, transforms=False)
    assert own.trivial == ["the output = input 0 (returned unchanged)"]


def test_a_task_that_discriminates_on_its_own_inputs_needs_no_extra_set():
    sets = planned(torch.tanh, lambda: [torch.randn(64, 256)])
    assert sets.ok and sets.needed == []


def test_a_near_constant_output_is_told_from_a_constant_only_if_it_moves_beyond_the_tolerance():
    # issue 36's chain: 8.1247 +- 1.5e-6, which a kernel returning 8.1247 passed on 5 of 5 sets.
    near = lambda x: 8.1247 + 1.5e-6 * torch.tanh(x)  # noqa: E731
    sets = planned(near, lambda: [torch.randn(32, 32)])
    assert not sets.ok and any("the constant 8.1247" in t for t in sets.trivial), sets.trivial
    assert planned(lambda x: 8.1247 + 1e-2 * torch.tanh(x), lambda: [torch.randn(32, 32)]).ok


def test_outputs_within_tolerance_of_zero_are_flagged_even_under_every_transform():
    sets = planned(lambda x: x * 1e-9, lambda: [torch.randn(32, 32)])
    assert not sets.ok and any("zeros" in t for t in sets.trivial)
    assert sets.needed == ["shift", "sign_flip", "normal", "special"]  # every transform tried before giving up


def test_an_output_that_does_not_change_with_the_inputs_is_told_from_a_fixed_answer():
    # KernelBench's level3/24_EfficientNetB2 and 28_VisionTransformer on the H100: the same output
    # for every input set, so an answer computed once (and returned for ever) passes.
    bias = torch.randn(16)
    sets = planned(lambda x: bias + 0 * x.sum(), lambda: [torch.randn(4, 8)])
    assert not sets.ok and any("one fixed tensor" in t for t in sets.trivial), sets.trivial
    assert planned(lambda x: bias + x.sum(), lambda: [torch.randn(4, 8)]).ok


def test_a_transform_whose_reference_is_not_finite_is_skipped_and_named():
    # The identity on positive inputs, a log on negative ones: every transform that makes a sign
    # change makes a NaN, so the harness must not ask a kernel for it, and the task stays trivial.
    sets = planned(lambda x: torch.where(x > 0, x, torch.log(x)), lambda: [torch.rand(64, 64) + 0.01])
    assert sets.needed == [] and [s.split(":")[0] for s in sets.skipped] == ["shift", "sign_flip", "normal", "special"]
    assert sets.trivial == ["the output = input 0 (returned unchanged)"]


def test_transforms_keep_shapes_dtypes_and_non_float_inputs():
    x, idx = torch.rand(8, 8), torch.arange(8)
    for name in ("shift", "sign_flip", "normal", "special", "sparse_sign"):
        out, same = transform_inputs(name, [x, idx], seed=1)
        assert out.shape == x.shape and out.dtype == x.dtype and same is idx
    dense = torch.rand(100_000)
    sparse = transform_inputs("sparse_sign", [dense], seed=3)[0]
    assert 1 <= int((sparse < 0).sum()) <= 8 and torch.equal(sparse[sparse >= 0], dense[sparse >= 0])  # a few scattered negatives
    assert (dense >= 0).all()  # the input itself is left as it was
    special = transform_inputs("special", [torch.rand(10_000)], seed=2)[0]
    assert (special == 0).any() and torch.signbit(special[special == 0]).any() and (special.abs() == 100).any()


RELU = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, x):
            return torch.relu(x)

    def get_inputs():
        return [torch.rand(256, 4096)]

    def get_init_inputs():
        return []
''')


def test_tasks_check_reports_the_sets_a_task_needs_and_synthesis_rejects_it(tmp_path: Path):
    path = tmp_path / "relu.py"
    path.write_text(RELU)
    task = load_task_file(path)
    checked = screen_task(task, "cpp", window_ms=(0.0, 1e9))
    assert checked.ok and checked.verification_sets == ["shift"]
    synthesized = screen_task(task, "cpp", window_ms=(0.0, 1e9), transforms=False)
    assert any("input 0 (returned unchanged)" in p for p in synthesized.problems), synthesized.problems


@pytest.mark.parametrize("body", ["torch.ones_like(x) * 3.0", "x * 0.0"])
def test_constant_tasks_fail_the_screen_whatever_the_transforms(tmp_path: Path, body):
    path = tmp_path / "c.py"
    path.write_text(RELU.replace("torch.relu(x)", body))
    result = screen_task(load_task_file(path), "cpp", window_ms=(0.0, 1e9))
    assert any("output is constant" in p for p in result.problems), result.problems
