"""The servers' CPUs kept awake through a request: a SCHED_IDLE spinner pinned to each, asleep
through each round, gone after the request."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from env_pool.trusted.awake_cpus import SPIN, Awake, awake
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
        started = [s.process for s in spinners.spinners]
        assert len(started) == 1 and settled(started[0].pid, cpu)
        assert started[0].poll() is None, "it spins until the request ends"
    assert started[0].returncode == -signal.SIGKILL
    with awake(()) as none:
        assert none.spinners == []
        none.round_begun(), none.round_over()  # nothing to tell: rounds go on as without


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def becomes(pid: int, wanted: str) -> bool:
    end = time.monotonic() + SETTLE_S
    while time.monotonic() < end:
        if state(pid) == wanted:
            return True
        time.sleep(0.005)
    return False


def preemptions(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])


def spinning(pid: int) -> bool:
    """Whether ``pid`` gets CPU time (its run time in schedstat grows), waiting for it a while."""
    ran = lambda: int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])  # noqa: E731
    first, end = ran(), time.monotonic() + SETTLE_S
    while time.monotonic() < end:
        time.sleep(0.001)
        if ran() > first:
            return True
    return False


def occupy(cpu: int, seconds: float = 0.05) -> None:
    """A busy process at a normal priority on ``cpu`` for ``seconds``, as a server's round takes its CPU."""
    code = f"import os, time\nos.sched_setaffinity(0, {{{cpu}}})\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_spinner_sleeps_once_the_round_has_taken_its_cpu_until_the_round_is_over():
    """Runnable through a round, a spinner is handed the CPU whenever the server's threads yield:
    in a round, it goes to sleep as soon as it gets its CPU back from the server, until the round
    is over. Before that it spins on, so the CPU never halts before the server wakes."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    with awake([cpu]) as spinners:
        pid = spinners.spinners[0].process.pid
        assert settled(pid, cpu)
        for _ in range(3):
            spinners.round_begun()
            occupy(cpu)
            assert becomes(pid, "S"), "it got its CPU back in a round, yet it spins"
            spinners.round_over()
            assert becomes(pid, "R"), "the round is over, yet it sleeps"
        for _ in range(5):  # asleep only once preempted (by anything: ~7 times a second here), never before
            before = preemptions(pid)
            assert spinning(pid), "woken after the round, it never ran again"  # since ``before``: it has seen that count
            spinners.round_begun()
            time.sleep(0.002)
            asleep = state(pid) == "S"
            assert not asleep or preemptions(pid) > before, "it slept before anything took its CPU: the CPU halts before the server's wake"
            spinners.round_over()


def test_a_spinner_not_in_its_loop_in_time_is_killed():
    """At its starting priority it would take the server's CPU; at SCHED_IDLE before its loop, it would spin through rounds."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    spinners = Awake()
    try:
        spinners.start(cpu)
        os.kill(spinners.spinners[0].process.pid, signal.SIGSTOP)
        spinners.settle(0.2)
        assert spinners.pinned == [] and spinners.spinners[0].process.wait(timeout=SETTLE_S) == -signal.SIGKILL
    finally:
        spinners.close()


def test_no_spinner_goes_on_a_cpu_the_harness_runs_on():
    """Runnable through the harness's staging, on the round's clock, it would now and then take a slice from the harness."""
    from env_pool.trusted.harness import spinner_cpus

    assert spinner_cpus(request_for(cpus=(1, 2, 3), harness_cpus=(0, 1), keep_cpus_awake=True)) == [2, 3]
    assert spinner_cpus(request_for(cpus=(0, 1), harness_cpus=(0, 1), keep_cpus_awake=True)) == []
    assert spinner_cpus(request_for(cpus=(1, 2), harness_cpus=(0,))) == []  # off by default


def test_a_spinner_that_cannot_be_pinned_is_killed_at_once():
    """Unpinned, it would spin on whichever CPU it liked, a server's among them."""
    with awake([4096]) as spinners:  # no such CPU: sched_setaffinity refuses it
        assert spinners.spinners[0].process.wait(timeout=SETTLE_S) == -signal.SIGKILL
        assert spinners.pinned == []  # no round tells it anything


def test_a_spinner_dies_with_the_harness_that_started_it():
    """A harness killed outright (no finally runs) takes its spinners with it: nothing outlives the command."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    code = ("import sys, time; from env_pool.trusted.awake_cpus import awake\n"
            f"with awake([{cpu}]) as s:\n    print(s.spinners[0].process.pid, flush=True); time.sleep(60)\n")
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


def test_in_a_real_evaluation_each_round_tells_the_spinners_before_the_thaw_and_wakes_them_after_the_freeze(tmp_path, monkeypatch):
    """The wiring: told after the thaw, a spinner could take a slice from a server thread that
    yields at once; woken before the freeze, it could run beside the server's last moments in the round."""
    from configs.schema import EnvConfig
    from env_pool.isolation.cgroups import Freezer
    from tests.corpus_cases import evaluate_in_process

    events: list[str] = []
    spinning: list[bool] = []  # per call to the spinners: were there any to tell

    def spy(cls, name: str) -> None:
        original = getattr(cls, name)

        def recorded(self, *args, **kwargs):
            events.append(name)
            if isinstance(self, Awake):
                spinning.append(bool(self.pinned))
            return original(self, *args, **kwargs)
        monkeypatch.setattr(cls, name, recorded)

    for cls, name in ((Freezer, "thaw"), (Freezer, "freeze"), (Awake, "round_begun"), (Awake, "round_over")):
        spy(cls, name)
    result = evaluate_in_process(EnvConfig(work_dir=str(tmp_path), pch_dir="", keep_cpus_awake=True), "verify")
    assert result.failure is None, result.message
    rounds = " ".join(events).count("round_begun thaw freeze round_over")
    assert rounds >= 5 and rounds == events.count("round_begun") == events.count("round_over"), events
    assert all(spinning), "a round ran without the request's spinners"
    assert spinners_of(os.getpid()) == []
