"""A task's baselines are timed on a quiet worker: builds wait, and a disturbed baseline is never kept.

The red team's compile burned ~80 s of the CPUs the harness used while another evaluation timed
the same task's baselines; the disturbed baselines were cached (eager 3.14 ms against a quiet
1.04 ms) and an honest kernel two milestones up got the top one.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time

import pytest

from env_pool.evaluate import BuildGate
from env_pool.trusted.code_sampler import CpuSampler, Disturbance, SamplerUnavailable


def test_builds_wait_while_baselines_are_timed_and_the_timing_waits_for_running_builds():
    gate = BuildGate(shared=True)
    events: list[str] = []
    building = threading.Event()
    release_build = threading.Event()

    def first_build():
        with gate.build():
            events.append("build 1 runs")
            building.set()
            release_build.wait(5)
            events.append("build 1 ends")

    def baselines():
        with gate.baselines():
            events.append("baselines timed")
            time.sleep(0.2)
            events.append("baselines end")

    def second_build():
        with gate.build():
            events.append("build 2 runs")

    t1 = threading.Thread(target=first_build)
    t1.start()
    building.wait(5)
    t2 = threading.Thread(target=baselines)
    t2.start()
    time.sleep(0.1)  # the timing is now waiting for build 1, and closes the gate to new builds
    t3 = threading.Thread(target=second_build)
    t3.start()
    time.sleep(0.1)
    assert events == ["build 1 runs"]
    release_build.set()
    for t in (t1, t2, t3):
        t.join(5)
    assert events == ["build 1 runs", "build 1 ends", "baselines timed", "baselines end", "build 2 runs"]


def test_a_gate_on_a_machine_with_cpus_to_spare_never_closes():
    gate = BuildGate(shared=False)
    with gate.baselines(), gate.build():
        pass


def busy(name: str, cpu: int) -> subprocess.Popen:
    """A process named like a compiler, spinning on ``cpu``."""
    return subprocess.Popen([sys.executable, "-c", (
        "import ctypes, os, sys\n"
        "ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)\n"  # PR_SET_NAME
        "os.sched_setaffinity(0, {int(sys.argv[2])})\n"
        "while True: pass\n"), name, str(cpu)])


@pytest.mark.parametrize("name, disturbed", [("cc1plus", True), ("python-other", False)])
def test_a_build_on_the_timing_cpus_marks_the_rounds_disturbed_other_load_does_not(name, disturbed):
    cpu = sorted(os.sched_getaffinity(0))[-1]
    try:
        sampler = CpuSampler([cpu])
    except (SamplerUnavailable, OSError) as err:
        pytest.skip(f"no perf sampling here: {err}")
    proc = busy(name, cpu)
    try:
        time.sleep(0.3)
        meter = Disturbance(sampler, own=set())
        for _ in range(4):
            sampler.enable(True)
            start = time.perf_counter_ns()
            time.sleep(0.05)
            end = time.perf_counter_ns()
            sampler.enable(False)
            meter.round_done(start, end)
        assert meter.too_disturbed is disturbed, meter.describe()
        if disturbed:
            assert "cc1plus" in meter.describe()
    finally:
        proc.kill()
        proc.wait()
        sampler.close()
