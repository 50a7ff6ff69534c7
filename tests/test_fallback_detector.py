"""The torch-op fallback detector (env_pool/candidate/guards.py): which ops of a forward it flags,
read from torch's profiler, and a profiler session stopped or replaced under it."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from env_pool.candidate import guards

X = torch.randn(8, 8)


def flags(forward) -> list[tuple[str, str]]:
    state = guards.GuardState(Path.cwd(), ())
    with torch.no_grad(), guards.FallbackDetector(state):
        forward()
    return [(v.guard, v.reason) for v in state.violations]


def legit_forward() -> None:
    """What a candidate's forward does around its kernel: allocations, views, layout, copies."""
    out = torch.empty_like(X)
    X.t().contiguous()
    X.to(torch.float64)
    X.flatten().view_as(X).reshape(64)
    torch.zeros(3).clone()
    out.copy_(X)
    X[0, 0].item()
    torch.tensor([2.0])  # lift_fresh, and inside it detach_


def test_allocations_views_and_copies_are_not_flagged():
    assert flags(legit_forward) == []


@pytest.mark.parametrize("forward, op", [
    (lambda: F.gelu(X), "aten.gelu"),
    (lambda: torch.ops.aten.gelu(X), "aten.gelu"),
    (lambda: X @ X, "aten.mm"),  # matmul is a composite: the mm it calls is judged
    (lambda: F.linear(X, X), "aten.linear"),  # its out= overload is a kernel: judged itself (and addmm or mm)
])
def test_torch_computing_is_a_fallback(forward, op):
    found = flags(forward)
    assert {g for g, _ in found} == {"torch_fallback"} and any(op + ":" in reason for _, reason in found)


def test_torch_under_disabled_dispatch_is_seen():
    """The case a Python dispatch mode missed (corpus torch_under_disabled_dispatch)."""
    def forward():
        with torch._C._DisableTorchDispatch():
            torch.softmax(X, dim=-1)

    assert {g for g, _ in flags(forward)} == {"torch_fallback"}


@pytest.mark.parametrize("scope", [
    torch.autograd.profiler.record_function,  # a user's scope
    torch._C._profiler._RecordFunctionFast,  # an op's scope, as a C++ extension's RECORD_FUNCTION opens one
])
def test_a_scope_named_for_an_allowed_op_vouches_for_nothing_inside_it(scope):
    def forward():
        with scope("aten::clone"):
            torch.relu(X)

    assert {g for g, _ in flags(forward)} == {"torch_fallback"}


def test_a_composite_is_not_flagged_itself_but_what_it_calls_is():
    assert guards.torch_fallbacks(["aten::matmul", "aten::mm", "aten::to", "aten::_to_copy", "aten::copy_"]) == {"aten::mm"}


def test_only_atens_ops_are_allowed_by_name():
    """An op of a library the candidate registers can take an allowed name (red team, stop 56)."""
    assert guards.torch_fallbacks(["mine::copy_", "aten::copy_"]) == {"mine::copy_"}


def test_a_stopped_profiler_is_tampering():
    assert [g for g, _ in flags(lambda: torch._C._autograd._disable_profiler_legacy())] == ["tamper"]


def test_a_replaced_profiler_session_is_tampering():
    def forward():
        torch._C._autograd._disable_profiler_legacy()
        torch.relu(X)
        torch._C._autograd._enable_profiler_legacy(torch.autograd.profiler_legacy.profile().config())

    found = flags(forward)
    assert [g for g, _ in found] == ["tamper"] and "replaced" in found[0][1]


def test_the_detector_leaves_no_profiler_running():
    flags(lambda: F.gelu(X))
    assert not torch._C._autograd._profiler_enabled()


TRIPPED = textwrap.dedent("""
    import sys
    from pathlib import Path
    import torch
    from env_pool.candidate import guards

    guards.prepare_detector()
    state = guards.install(Path(sys.argv[1]))  # trips the switches, as a candidate's server does
    x = torch.randn(8)

    def watched(forward):
        state.violations.clear()
        with guards.FallbackDetector(state):
            try:
                forward()
            except PermissionError:
                pass
        return sorted({v.guard for v in state.violations})

    print(watched(lambda: torch.empty_like(x).copy_(x)))
    print(watched(lambda: torch.relu(x)))
    print(watched(lambda: torch.autograd._enable_record_function(False)))
    print(watched(lambda: torch._C._autograd._clear_callbacks()))
    print(watched(lambda: torch.ops.aten.relu.default.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), x)))
""")


def test_the_switches_are_tripped_and_the_detector_keeps_its_own(tmp_path):
    """In a process of its own: the tripped switches cannot be put back in this one."""
    run = subprocess.run([sys.executable, "-c", TRIPPED, str(tmp_path)], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parent.parent)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split("\n")[:5] == ["[]", "['torch_fallback']", "['tamper']", "['tamper']", "['tamper']"]
