"""The servers' CPUs kept awake through a request: a SCHED_IDLE spinner pinned to each, asleep
through each round, gone after the request."""
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
        started = [s.process for s in spinners.spinners]
        assert len(started) == 1 and settled(started[0].pid, cpu)
        assert spinners.words[spinners.spinners[0].word] == 1, "awake() returns once each spinner runs"
        assert started[0].poll() is None, "it spins until the request ends"
    assert started[0].returncode == -signal.SIGKILL
    with awake(()) as none:
        assert none.spinners == []
        none.pause(), none.resume()  # nothing to pause: rounds go on as without


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def becomes(pid: int, wanted: str) -> bool:
    end = time.monotonic() + SETTLE_S
    while time.monotonic() < end:
        if state(pid) == wanted:
            return True
        time.sleep(0.005)
    return False


def test_a_paused_spinner_is_asleep_until_resumed():
    """Runnable through a round, a spinner is handed the CPU whenever the server's threads yield:
    paused, it is asleep from before GO until the server is frozen again."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    with awake([cpu]) as spinners:
        spinner = spinners.spinners[0]
        pid = spinner.process.pid
        assert settled(pid, cpu)
        for _ in range(3):
            spinners.pause()
            assert spinners.words[spinner.word] == spinners.words[0], "pause returned before the spinner said it sleeps"
            assert becomes(pid, "S"), "paused, yet it spins"
            spinners.resume()
            assert becomes(pid, "R"), "resumed, yet it sleeps"


def test_a_spinner_that_cannot_be_pinned_is_killed_at_once():
    """Unpinned, it would spin on whichever CPU it liked, a server's among them."""
    with awake([4096]) as spinners:  # no such CPU: sched_setaffinity refuses it
        assert spinners.spinners[0].process.wait(timeout=SETTLE_S) == -signal.SIGKILL
        assert spinners.pinned == []  # a pause waits for none


def test_a_spinner_that_does_not_answer_a_pause_is_killed_and_not_waited_for_again():
    """Stopped (or starved), it would run in the round, and every later pause would wait for it."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    with awake([cpu]) as spinners:
        spinner = spinners.spinners[0]
        os.kill(spinner.process.pid, signal.SIGSTOP)
        spinners.pause()
        assert spinners.pinned == [] and spinners.dropped == [cpu]
        assert spinner.process.wait(timeout=SETTLE_S) == -signal.SIGKILL
        spinners.resume()
        begin = time.perf_counter()
        spinners.pause(), spinners.resume()
        assert time.perf_counter() - begin < 1e-3 / 2, "a pause waited for the killed spinner"


def test_no_spinner_goes_on_a_cpu_the_harness_runs_on():
    """There the harness's own wait for it to sleep keeps it from saying so: every round would wait it out."""
    from env_pool.trusted.harness import spinner_cpus

    assert spinner_cpus(request_for(cpus=(1, 2, 3), harness_cpus=(0, 1), keep_cpus_awake=True)) == [2, 3]
    assert spinner_cpus(request_for(cpus=(0, 1), harness_cpus=(0, 1), keep_cpus_awake=True)) == []
    assert spinner_cpus(request_for(cpus=(1, 2), harness_cpus=(0,))) == []  # off by default


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


def test_in_a_real_evaluation_every_round_runs_with_the_spinners_asleep(tmp_path, monkeypatch):
    """The wiring: the harness pauses its spinners before each round's GO and wakes them after."""
    from configs.schema import EnvConfig
    from env_pool.trusted import awake_cpus, round_protocol
    from tests.corpus_cases import evaluate_in_process

    seen: list[tuple[bool, bool]] = []  # per round: every running spinner asleep after the pause, awake again after the round
    pause, serve = awake_cpus.Awake.pause, round_protocol.Session._round

    def paused(self):
        pause(self)
        running = [s.process.pid for s in self.pinned]
        seen.append((bool(running) and all(becomes(pid, "S") for pid in running), False))

    def round_then_awake(self, *args):
        serve(self, *args)
        if seen:
            seen[-1] = (seen[-1][0], not self.rounds.awake.words[0] & 1)

    monkeypatch.setattr(awake_cpus.Awake, "pause", paused)
    monkeypatch.setattr(round_protocol.Session, "_round", round_then_awake)
    result = evaluate_in_process(EnvConfig(work_dir=str(tmp_path), pch_dir="", keep_cpus_awake=True), "verify")
    assert result.failure is None, result.message
    assert len(seen) >= 5 and all(awake_again for _, awake_again in seen)
    assert all(asleep for asleep, _ in seen), f"a spinner ran through a round: {seen}"
    assert spinners_of(os.getpid()) == []
