"""env_pool.trusted.code_sampler: the harness's own record of which code the candidate's CPU ran.

A real child process, pinned to one CPU, runs one piece of work per window while this process
samples that CPU: its own compiled library, numpy's BLAS, torch's matmul, a copy of a library
in its scratch folder. Each window must be attributed to the right code, and judged.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy
import pytest

from env_pool.trusted.code_sampler import (CodeIdentity, CodeLedger, CpuSampler, Mapping, PhaseSampling, Sample,
                                          cpu_time_shares, judge)
from env_pool.trusted.round_protocol import RoundsFailed, open_sampler
from tests.harness_requests import request_for

CHILD = """
import ctypes, os, sys, time
import numpy as np, torch
os.sched_setaffinity(0, {{{cpu}}})
torch.set_num_threads(1)
own = ctypes.CDLL({own!r})
copy = ctypes.CDLL({copy!r})  # a library's code, loaded from the scratch folder under another name
x = np.ones(1 << 20, dtype=np.float32)
a = np.random.rand(256, 256).astype(np.float32)
t = torch.rand(256, 256)
ptr = x.ctypes.data_as(ctypes.c_void_p)
work = {{
    "own": lambda: own.spin(ptr, ctypes.c_size_t(x.size), 40),
    "numpy": lambda: [a @ a for _ in range(60)],
    "torch": lambda: [t @ t for _ in range(60)],
    "copy": lambda: copy.spin(ptr, ctypes.c_size_t(x.size), 40),
}}
print("ready", flush=True)
for line in sys.stdin:
    start = time.perf_counter_ns()
    work[line.strip()]()
    print(start, time.perf_counter_ns(), flush=True)
"""


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    """(process, scratch folder, CPU): a process that runs named work on one CPU, on request."""
    scratch = tmp_path_factory.mktemp("scratch")
    source = scratch / "k.c"
    source.write_text("#include <stddef.h>\nvoid spin(float* x, size_t n, int reps) {"
                      " for (int r = 0; r < reps; r++) for (size_t i = 0; i < n; i++) x[i] = x[i] * 1.0001f + 0.5f; }\n")
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", str(source), "-o", str(scratch / "kernel.so")], check=True)
    shutil.copyfile(scratch / "kernel.so", scratch / "libc.so.6")  # a copy: same code, not the trusted file
    cpu = min(os.sched_getaffinity(0))
    code = textwrap.dedent(CHILD).format(cpu=cpu, own=str(scratch / "kernel.so"), copy=str(scratch / "libc.so.6"))
    # One BLAS thread: OpenBLAS's pool threads spin on after a call, into the next window.
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    yield proc, scratch, cpu
    proc.stdin.close()
    proc.wait(timeout=30)


def sampled(child, work: str) -> CodeLedger:
    proc, scratch, cpu = child
    sampler = CpuSampler([cpu])
    try:
        sampler.enable(True)
        phase = PhaseSampling(sampler, {proc.pid}, CodeIdentity.for_scratch(scratch), rounds=1)
        proc.stdin.write(work + "\n")
        proc.stdin.flush()
        start, end = map(int, proc.stdout.readline().split())
        phase.round_done(start, end)
        return phase.ledger
    finally:
        sampler.close()


def share(ledger: CodeLedger, category: str) -> float:
    return ledger.counts[category] / max(1, ledger.total)


def test_own_kernel_code_is_the_candidates_and_passes(child):
    ledger = sampled(child, "own")
    assert ledger.total > 20 and share(ledger, "own") > 0.9, ledger.to_dict()
    assert judge(ledger, None) == []


def test_numpy_blas_is_a_library_fallback(child):
    ledger = sampled(child, "numpy")
    assert share(ledger, "library") > 0.8, ledger.to_dict()
    assert [v["guard"] for v in judge(ledger, None)] == ["library_fallback"]
    assert any("openblas" in name.lower() for name in ledger.labels["library"]), ledger.labels["library"]


def test_torch_compute_is_a_torch_fallback(child):
    ledger = sampled(child, "torch")
    assert share(ledger, "torch") > 0.8, ledger.to_dict()
    assert [v["guard"] for v in judge(ledger, None)] == ["torch_fallback"]


def test_a_copy_in_the_scratch_folder_is_not_the_candidates_own_code(child):
    # Same bytes as kernel.so, named like libc: neither its name nor its content makes it trusted.
    ledger = sampled(child, "copy")
    assert share(ledger, "library") > 0.9, ledger.to_dict()
    assert "library_fallback" in [v["guard"] for v in judge(ledger, None)]


def test_identity_is_the_inode_of_the_sealed_file(tmp_path):
    kernel = tmp_path / "kernel.so"
    kernel.write_bytes(b"\x7fELF")
    identity = CodeIdentity.for_scratch(tmp_path)
    st = kernel.stat()
    mapped = Mapping(0, 4096, (os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino, str(kernel))
    assert identity.category(mapped)[0] == "own"
    kernel.unlink()
    kernel.write_bytes(b"\x7fELF")  # replaced: a new inode at the same path (the old one is held open)
    st = kernel.stat()
    replaced = Mapping(8192, 12288, (os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino, str(kernel))
    assert identity.category(replaced)[0] == "library"
    identity.close()


@pytest.mark.parametrize("path", ["", "[heap]", "/memfd:jit (deleted)", "/nonexistent/libfast.so"])
def test_code_outside_installed_files_is_library(tmp_path, path):
    identity = CodeIdentity.for_scratch(tmp_path)
    assert identity.category(Mapping(0, 4096, (0, 0), 1, path))[0] == "library"
    assert identity.category(None)[0] == "library"


def test_installed_libraries_are_classified_by_what_they_are(tmp_path):
    identity = CodeIdentity.for_scratch(tmp_path)

    def category_of(path: str) -> str:
        st = os.stat(path)
        return identity.category(Mapping(0, 4096, (os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino, path))[0]

    import torch

    torch_lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    numpy_core = next(Path(numpy.__file__).parent.glob("_core/_multiarray_umath*.so"))
    assert category_of(str(torch_lib)) == "torch"
    assert category_of(str(numpy_core)) == "library"
    assert category_of(os.path.realpath(sys.executable)) == "runtime"


def ledger_of(rounds: int, **counts: int) -> CodeLedger:
    """A ledger of ``rounds`` rounds, each category's samples spread over them evenly."""
    ledger = CodeLedger()
    for r in range(rounds):
        ledger.start_round()
        for category, n in counts.items():
            for _ in range(n // rounds + (r < n % rounds)):
                ledger.add(category, category)
    return ledger


def ledger_by_round(torch_rounds: list[int], own: int = 60) -> CodeLedger:
    """A ledger whose rounds hold these torch samples each (and ``own`` of the kernel's own)."""
    ledger = CodeLedger()
    for n in torch_rounds:
        ledger.start_round()
        for category, count in (("torch", n), ("own", own)):
            for _ in range(count):
                ledger.add(category, category)
    return ledger


def test_judge_thresholds():
    # The null phase's torch time (output allocation, the copy into the slots) is every round's.
    null = ledger_of(4, runtime=40, torch=28, kernel=20)
    quiet = ledger_of(4, own=400, runtime=60, torch=30, library=2, kernel=500)
    assert judge(quiet, null) == []  # torch glue as in the null phase, stray library samples, page faults
    heavy = ledger_of(4, own=100, torch=300)
    assert [v["guard"] for v in judge(heavy, null)] == ["torch_fallback"]
    # rt2_torch_dilution: torch under half of the samples (padding in the interpreter), 3 ms a round of it.
    diluted = ledger_of(4, runtime=182, torch=120, kernel=35)
    assert [v["guard"] for v in judge(diluted, null)] == ["torch_fallback"]
    # Library padding: a small share of a long round is still 0.5 ms of library a round.
    padded = ledger_of(4, own=4000, library=20)
    assert [v["guard"] for v in judge(padded, null)] == ["library_fallback"]


def test_a_legitimate_round_with_a_one_off_millisecond_of_torch_is_not_a_fallback():
    # The CI's 2 cores: 1.5 ms of torch in one round of four, a few samples in the others. A mean
    # over the rounds (0.45 ms beyond the null phase's) flagged gelu_omp and scaled_softmax.
    null = ledger_by_round([1, 0, 1, 0])
    assert judge(ledger_by_round([2, 15, 1, 3]), null) == []
    assert [v["guard"] for v in judge(ledger_by_round([9, 15, 8, 10]), null)] == ["torch_fallback"]


def times(own: int, torch: int) -> list[int]:
    """Timed rounds' times (ns), distinct: ``own`` rounds of about 3 ms, then ``torch`` faster ones of about 2 ms."""
    return [3_000_000 + 10_000 * k for k in range(own)] + [2_000_000 + 10_000 * k for k in range(torch)]


def test_torch_in_the_rounds_the_timing_rests_on_is_a_fallback_however_few_of_all_rounds_they_are():
    # 5 checked and 5 warm-up rounds by the candidate's own kernel, torch in the last 5 of 9 timed
    # ones and faster: the timing's median is torch's, while 5 of 18 rounds leave the median round torch-free.
    null = ledger_by_round([3] * 17)  # 0.3 ms of torch serving the outputs
    rounds = [3] * 13 + [20] * 5
    fast_torch = times(own=4, torch=5)
    assert judge(ledger_by_round(rounds), null) == []  # verify mode has no timed rounds to look at
    assert [v["guard"] for v in judge(ledger_by_round(rounds), null, timed_ns=fast_torch)] == ["torch_fallback"]
    # One torch round undersampled (0.7 ms of a 2 ms softmax; 0.89 ms of 1.5 on the CI) leaves
    # the least of the five torch rounds under the floor; their mean is not.
    assert [v["guard"] for v in judge(ledger_by_round([3] * 13 + [7, 20, 20, 20, 20]), null, timed_ns=fast_torch)] \
        == ["torch_fallback"]
    # Torch in 4 of the 9, still the faster: 4 of the 5 rounds at or below the median are torch's.
    assert [v["guard"] for v in judge(ledger_by_round([3] * 14 + [20] * 4), null,
                                      timed_ns=times(own=5, torch=4))] == ["torch_fallback"]
    # A legitimate kernel's one-off torch millisecond in one fast round is not computing.
    assert judge(ledger_by_round([3] * 17 + [18]), null, timed_ns=times(own=8, torch=1)) == []


def test_a_samples_time_is_its_share_of_its_cpus_window_whatever_the_period():
    """A 2 ms round on one CPU sampled every 400 us (a long period drawn, and kept a while): its
    5 samples stand for 2 ms, not 5 x 100 us. So counted, a 2 ms torch softmax read 0.6 ms in
    one round of torch_in_most_timed_rounds and the fallback passed one run in four."""
    server, other = 7, 8
    start = 1_000_000
    slow = [Sample(start + 400_000 * k, server, 0, False, cpu=0) for k in range(5)]
    busy = [Sample(start + 50_000 * k, other if k % 2 else server, 0, False, cpu=1) for k in range(40)]
    shares = cpu_time_shares(slow + busy + [Sample(start + 3_000_000, server, 0, False)], start, start + 2_000_000, {server})
    on = {cpu: sum(ns for s, ns in shares if s.cpu == cpu) for cpu in (0, 1)}
    assert on[0] == 2_000_000, "the slowly sampled CPU was the server's for the whole window"
    assert on[1] == 1_000_000, "half the samples of the busy CPU were another process's"
    assert len(shares) == 25, "samples outside the window or of other processes stand for nothing"


def test_no_sampler_is_infra_not_an_unwatched_run():
    with pytest.raises(RoundsFailed) as no_cpus:
        open_sampler(request_for(cpus=()))
    assert no_cpus.value.kind == "infra"
    with pytest.raises(RoundsFailed) as bad_cpu:
        open_sampler(request_for(cpus=(4095,)))
    assert bad_cpu.value.kind == "infra" and "env.code_sampling=false" in str(bad_cpu.value)
    assert open_sampler(request_for(cpus=(), code_sampling=False)) is None
