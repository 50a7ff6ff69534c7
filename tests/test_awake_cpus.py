"""The servers' CPUs kept awake through a request: a SCHED_IDLE spinner pinned to each, gone after it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from env_pool.trusted.awake_cpus import SPIN, awake
from tests.harness_requests import request_for

SETTLE_S = 5.0  # a spinner's interpreter start-up, on a loaded 2-core machine


def spinners_of(parent: int) -> list[int]:
    """The pids of ``parent``'s children that run the awake_cpus spinner."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and SPIN.encode() in command:
            found.append(int(entry.name))
    return found


def settled(pid: int, cpu: int) -> bool:
    """Whether ``pid`` has pinned itself to ``cpu`` at SCHED_IDLE, waiting out its start-up."""
    end = time.monotonic() + SETTLE_S
    while time.monotonic() < end:
        if os.sched_getaffinity(pid) == {cpu} and os.sched_getscheduler(pid) == os.SCHED_IDLE:
            return True
        time.sleep(0.02)
    return False


def gone(pid: int) -> bool:
    end = time.monotonic() + SETTLE_S
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":  # killed, not yet reaped by its (dead) parent's reaper
            return True
        time.sleep(0.02)
    return False


def test_each_cpu_gets_a_pinned_lowest_priority_spinner_killed_and_reaped_after():
    cpu = sorted(os.sched_getaffinity(0))[0]
    with awake([cpu]) as spinners:
        assert len(spinners) == 1 and settled(spinners[0].pid, cpu)
        assert spinners[0].poll() is None, "it spins until the request ends"
    assert spinners[0].returncode == -signal.SIGKILL
    with awake(()) as none:
        assert none == []


def test_a_spinner_that_cannot_be_pinned_is_killed_at_once():
    """Unpinned, it would spin on whichever CPU it liked, a server's among them."""
    with awake([4096]) as spinners:  # no such CPU: sched_setaffinity refuses it
        assert spinners[0].wait(timeout=SETTLE_S) == -signal.SIGKILL


def test_a_spinner_dies_with_the_harness_that_started_it():
    """A harness killed outright (no finally runs) takes its spinners with it: nothing outlives the command."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    code = ("import sys, time; from env_pool.trusted.awake_cpus import awake\n"
            f"with awake([{cpu}]) as s:\n    print(s[0].pid, flush=True); time.sleep(60)\n")
    harness = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                               cwd=Path(__file__).resolve().parent.parent)
    try:
        spinner = int(harness.stdout.readline())
        assert settled(spinner, cpu)
        harness.kill()
        harness.wait()
        assert gone(spinner), "the spinner outlived the harness"
    finally:
        harness.kill()


def test_the_harness_keeps_the_requests_server_cpus_awake_only_while_it_serves_and_only_when_asked(monkeypatch):
    from env_pool.trusted import harness
    from tasks.loader import load_tasks

    task = {t.id: t for t in load_tasks()[0]}["level1/01_gelu"]
    cpu = sorted(os.sched_getaffinity(0))[0]
    seen = []

    def evaluate_rounds(rounds, pool, request):
        spinners = spinners_of(os.getpid())
        seen.append([settled(pid, cpu) for pid in spinners])
        return {"ok": True}

    monkeypatch.setattr(harness, "evaluate_rounds", evaluate_rounds)
    cache = harness.TaskCache()
    assert harness.handle(request_for(task, cpus=(cpu,), keep_cpus_awake=True).to_wire(), cache, None) == {"ok": True}
    assert seen == [[True]], "one spinner, on the request's server CPU, while its rounds run"
    assert spinners_of(os.getpid()) == [], "gone once the request is answered"
    harness.handle(request_for(task, cpus=(cpu,)).to_wire(), cache, None)
    assert seen[-1] == [], "env.keep_cpus_awake=false, the default: none"
