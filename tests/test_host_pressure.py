"""A run that fails while the machine is short of memory, or its CPUs are held by others, says so (env_pool/isolation/host_pressure.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from env_pool.evaluate import machine_at_fault
from env_pool.isolation import host_pressure
from env_pool.isolation.host_pressure import HostState, Process
from env_pool.trusted.harness_process import HarnessProcess

COMPILERS = (Process(4380, "cc1plus -quiet", 1706.0, 0.1), Process(4373, "cc1plus -quiet", 1690.0, 0.1))


def state(available_mb: float, others_cpu: float = 0.0, stall: float = 0.0) -> HostState:
    return HostState(total_mb=24105, available_mb=available_mb, swap_used_mb=0, memory_stall_pct=stall, watched_cpus=1,
                     others_cpu=others_cpu, largest=COMPILERS, busiest=COMPILERS[:1])


def test_a_machine_short_of_memory_is_named_with_its_largest_processes():
    told = host_pressure.explain(state(available_mb=900))
    assert "short of memory (900 of 24105 MB available)" in told, told
    assert "cc1plus -quiet (pid 4380) 1706 MB, cc1plus -quiet (pid 4373) 1690 MB" in told, told


def test_memory_stalls_count_as_short_even_with_memory_available():
    told = host_pressure.explain(state(available_mb=12000, stall=35.0))
    assert "stalled on memory 35% of the last 10 s" in told, told


def test_a_machine_with_memory_and_free_cpus_blames_nothing():
    assert host_pressure.explain(state(available_mb=20000, others_cpu=0.2)) == ""


def test_only_the_shortage_asked_about_is_told():
    busy = state(available_mb=20000, others_cpu=0.9)
    assert "hold its CPUs (0.9 of 1 busy" in host_pressure.explain(busy)
    assert host_pressure.explain(busy, cpu=False) == "", "an out-of-memory failure is not explained by busy CPUs"


def spinner(cpu: int, idle: bool = False) -> subprocess.Popen:
    """A process spinning on ``cpu``, at SCHED_IDLE if ``idle``; started, pinned and spinning when returned."""
    policy = "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n" if idle else ""
    proc = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\n{policy}while True: pass"])
    time.sleep(1.0)
    return proc


@pytest.fixture
def hog():
    """A process spinning on this process's last CPU."""
    cpu = max(os.sched_getaffinity(0))
    proc = spinner(cpu)
    yield proc, cpu
    proc.kill()
    proc.wait()


def test_an_idle_priority_spinner_on_the_watched_cpu_holds_it_from_nobody():
    """The harness's own spinners (env_pool/trusted/awake_cpus.py) run while a hung candidate's verdict
    is read: counted, its timeout was the machine's fault (infra: retried, then dropped, never failed)."""
    cpu = max(os.sched_getaffinity(0))
    proc = spinner(cpu, idle=True)
    try:
        assert os.sched_getscheduler(proc.pid) == os.SCHED_IDLE
        found = host_pressure.snapshot([cpu])
        assert not found.cpus_held and proc.pid not in [p.pid for p in found.busiest], found
        verdict = {"ok": False, "failure": "timeout", "message": "the candidate exceeded its time limit"}
        assert machine_at_fault(verdict, [cpu]) == verdict
    finally:
        proc.kill()
        proc.wait()


def test_a_process_spinning_on_the_watched_cpu_is_found(hog):
    proc, cpu = hog
    found = host_pressure.snapshot([cpu])
    assert found.cpus_held and proc.pid in [p.pid for p in found.busiest], found
    assert 0 < found.available_mb <= found.total_mb


def test_a_server_timeout_while_others_hold_its_cpus_is_the_machines_fault(hog, tmp_path):
    proc, cpu = hog
    harness = HarnessProcess(tmp_path / "harness.log")
    verdict = {"ok": False, "failure": "timeout", "message": "the baselines' server exceeded its time limit\nits output"}
    judged = machine_at_fault(verdict, [cpu], harness)
    assert judged["failure"] == "infra", judged
    assert judged["message"].startswith("the baselines' server exceeded its time limit, but the fault is the machine's: "
                                        "other processes hold its CPUs"), judged["message"]
    assert f"(pid {proc.pid})" in judged["message"] and judged["message"].endswith("\nits output")
    assert f"(pid {proc.pid})" in (tmp_path / "harness.log").read_text(), "harness.log records it"


def test_a_guard_violation_stands_whatever_the_machine_did(hog):
    _, cpu = hog
    verdict = {"ok": False, "failure": "timeout", "message": "slow", "violations": [{"guard": "tamper", "reason": "x"}]}
    assert machine_at_fault(verdict, [cpu]) == verdict
