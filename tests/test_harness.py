"""The trusted side's rules, one by one: round memory, timing arithmetic, what it takes from a server.

The corpus (tests/test_env_corpus.py) proves the verdicts end to end; these pin down the pieces
that make them trustworthy, so a regression names the rule it broke.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import msgpack
import pytest
import torch

from env_pool.trusted.round_protocol import (RoundsFailed, _kind_and_message, _outcome_failure, _untrusted_report, wait_ready,
                                             above_protocol_noise, net_timing)
from env_pool.isolation.sandbox import SandboxOutcome
from env_pool.shared.rounds import GO, READY, Control, SlotMemory, plan_layout
from env_pool.trusted.harness_process import HarnessProcess
from env_pool.trusted.harness_request import HarnessRequest
from tasks.task import Task
from tests.harness_requests import request_for



def test_a_request_crosses_to_the_harness_whole_and_a_malformed_one_is_named():
    request = request_for(Task(id="t", level=1, source="x = 1\n"), cpus=(0, 1))
    wire = msgpack.unpackb(msgpack.packb(request.to_wire()))  # as the harness reads it: tuples come back as lists
    assert HarnessRequest.from_wire(wire) == request
    with pytest.raises(ValueError, match="missing \\['backend'\\]"):
        HarnessRequest.from_wire({k: v for k, v in wire.items() if k != "backend"})
    with pytest.raises(ValueError, match="unknown field.*'wall_s'"):
        HarnessRequest.from_wire({**wire, "wall_s": 1.0})
    with pytest.raises(ValueError, match="'threads' must be of type int, got str"):
        HarnessRequest.from_wire({**wire, "threads": "2"})

def outcome(result: bytes | None) -> SandboxOutcome:
    return SandboxOutcome(returncode=0, signal_name=None, timed_out=False, out_of_memory=False, cpu_limited=False,
                          output="", result=result, wall_s=1.0)


def test_net_time_is_the_round_less_the_harness_own_work_in_the_null_phase_with_a_floor():
    null_staging = [1_000_000, 1_000_000, 1_100_000]  # the null phase's input writes and output reads, not its rounds
    timing = net_timing([3_000_000, 5_000_000, 4_000_000], null_staging_ns=null_staging)
    assert timing.median_ms == pytest.approx(3.0) and timing.repetitions == 3
    assert above_protocol_noise(timing, staging_ns=[400_000] * 3)
    assert net_timing([500_000], null_staging_ns=[1_000_000]).median_ms == pytest.approx(1e-3)  # never zero or negative


def test_a_net_time_inside_the_protocols_noise_is_not_a_timing():
    # The H100 case: a null phase of ~0.8 ms spread over tens of us, rounds barely above its median.
    null = [640_000, 700_000, 760_000, 800_000, 810_000, 790_000, 700_000]
    timing = net_timing([804_000, 790_000, 815_000, 805_000], null_staging_ns=null)
    # 45 us net against 240 us of copies in and out (a floor of 60 us): not a kernel's time.
    assert timing.median_ms < 0.05 and not above_protocol_noise(timing, staging_ns=[240_000] * 4)
    assert above_protocol_noise(timing, staging_ns=[80_000] * 4)


def test_the_server_report_keeps_only_short_well_formed_strings():
    forged = msgpack.packb({"violations": [{"guard": "x" * 100, "reason": "r" * 3000}, {"guard": 1, "reason": "y"}, "junk"],
                            "stage": "s" * 3000, "error": ["not", "text"], "candidate": {"median_ms": 1e-9}})
    report = _untrusted_report(outcome(forged))
    assert report["violations"] == [{"guard": "x" * 40, "reason": "r" * 400}] and report["readable"]
    assert len(report["stage"]) == 1000 and report["error"] == "" and "candidate" not in report
    empty = {"violations": [], "stage": "", "error": "", "readable": False}
    assert _untrusted_report(outcome(b"\xc1not msgpack")) == empty
    assert _untrusted_report(outcome(msgpack.packb([1, 2]))) == empty
    assert _untrusted_report(outcome(b"\xc0" + msgpack.packb({"violations": []}))) == empty  # a stray byte first
    assert _untrusted_report(outcome(msgpack.packb({"violations": []}) + b"\xc0")) == empty  # or trailing
    bomb = b"\xdd" + (10**6).to_bytes(4, "big") + b"\x90" * 10**6  # a million empty arrays in 1 MB
    assert _untrusted_report(outcome(msgpack.packb({"v": 1})[:0] + bomb)) == empty


@pytest.mark.parametrize("message, kind", [
    ("[wrong] output has shape [2], expected [3]", "wrong"),
    ("[crash] RuntimeError: CUDA out of memory", "out_of_memory"),
    ("[pass] trust me", "crash"),  # an unknown kind is the default, never a pass
    ("no brackets", "crash"),
])
def test_the_server_message_names_a_failure_never_a_success(message, kind):
    assert _kind_and_message(message, "crash")[0] == kind


def test_a_server_out_of_memory_is_named_with_its_limit_and_the_peak_seen():
    """The H100's baselines run read "the candidate exceeded the memory limit" for a trusted server, with no figure."""
    ended = SandboxOutcome(returncode=None, signal_name="SIGKILL", timed_out=False, out_of_memory=True, cpu_limited=False,
                           output="", result=None, wall_s=9.0, peak_memory_mb=8301.4)
    failure = _outcome_failure(ended, {}, None, True, "the baselines' server", 8192)
    assert failure.kind == "out_of_memory"
    assert str(failure).startswith("the baselines' server ran out of memory (host limit 8192 MB, highest seen 8301 MB)")


def test_a_server_that_loads_candidate_code_can_never_claim_infra():
    control = Control.create()
    try:
        alive = threading.Thread(target=lambda: None)
        control.set_message("[infra] could not install the seccomp filter")  # what the red team forged
        control.words[READY] = -1
        with pytest.raises(RoundsFailed) as candidate:
            wait_ready(control, 0, alive, trusted=False)
        with pytest.raises(RoundsFailed) as baseline:
            wait_ready(control, 0, alive, trusted=True)
        control.set_message("[import] SyntaxError: invalid syntax (at model_new.py:3)")
        with pytest.raises(RoundsFailed) as bad_import:
            wait_ready(control, 0, alive, trusted=False)
        assert (candidate.value.kind, baseline.value.kind, bad_import.value.kind) == ("crash", "infra", "compile_error")
    finally:
        control.close()
        os.close(control.fd)


def test_round_memory_cannot_be_shrunk_by_the_server():
    control = Control.create()
    memory = SlotMemory.create(4096, "cpu")
    try:
        for fd in (control.fd, memory.fd):
            with pytest.raises(PermissionError):
                os.ftruncate(fd, 0)  # sealed: a SIGBUS in the harness would turn a hack into an infra failure
    finally:
        control.close()
        memory.close()


def test_each_slot_has_its_own_version_counter_and_sees_the_other_mappings_writes():
    layout = plan_layout([torch.ones(8), 3], [torch.ones(8)], "cpu")
    harness_side = SlotMemory.create(layout.size, "cpu")
    server_side = SlotMemory.attach(harness_side.fd, layout.size, "cpu")
    try:
        x_server = server_side.view(layout.args[0]["slot"])
        version = x_server._version
        harness_side.view(layout.args[0]["slot"]).copy_(torch.arange(8.0))  # fresh contents, same address
        assert torch.equal(x_server, torch.arange(8.0))
        assert x_server._version == version  # a replay keyed on (data_ptr, _version) gets a stale answer
        assert layout.args[1] == {"value": 3}
        # No output has a place in protocol memory on the CPU: the harness reads it from the server's own.
        assert layout.size == 256 and layout.arena_size == 0 and layout.outputs[0].shape == [8]
    finally:
        server_side.close()
        harness_side.close()


def test_outputs_are_read_from_the_servers_own_memory_and_an_unreadable_place_fails():
    from env_pool.trusted.readout import Unreadable, read_process

    ready, done = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", (
        "import ctypes, os, sys, time\n"
        "buf = (ctypes.c_float * 1000)(*range(1000))\n"
        "os.write(int(sys.argv[1]), ctypes.addressof(buf).to_bytes(8, 'little'))\n"
        "time.sleep(60)\n"), str(done)], pass_fds=(done,))
    try:
        address = int.from_bytes(os.read(ready, 8), "little")
        into = torch.empty(1000)
        read_process(child.pid, address, into)
        assert torch.equal(into, torch.arange(1000.0))
        with pytest.raises(Unreadable):
            read_process(child.pid, 8, into)  # nothing is mapped there
    finally:
        child.kill()
        child.wait()
        os.close(ready)
        os.close(done)


@pytest.mark.gpu
def test_gpu_slots_of_a_size_off_the_allocation_granularity_attach_in_the_server(tmp_path: Path):
    # KernelBench's HingeLoss lays out 4096.12 MB: its server reserved that unrounded size for an
    # allocation rounded up to 2 MiB, and every start failed (cuMemAddressReserve, CUresult 1).
    # The server's round allocates its output in the arena, where the harness reads it by offset.
    from env_pool.trusted.readout import read_arena

    layout = plan_layout([torch.ones(3, 1000, device="cuda"), 3], [torch.ones(1000, device="cuda")], "cuda")
    assert layout.arena_offset % (2 << 20) == 0 and layout.arena_size >= 1000 * 4
    harness_side = SlotMemory.create(layout.size + 4096, "cuda")  # off the granularity
    harness_side.view(layout.args[0]["slot"]).copy_(torch.arange(3000.0, device="cuda").view(3, 1000))
    torch.cuda.synchronize()
    server = (
        "import json, sys, torch\n"
        "from env_pool.shared.arena import Arena\n"
        "from env_pool.shared.rounds import Layout, SlotMemory\n"
        "layout = Layout.from_dict(json.loads(sys.argv[2]))\n"
        "memory = SlotMemory.attach(int(sys.argv[1]), layout.size + 4096, 'cuda')\n"
        "arena = Arena(memory.address(layout.arena_offset), layout.arena_size)\n"
        "x = memory.view(layout.args[0]['slot'])\n"
        "with arena.allocating():\n"
        "    out = x.sum(0)\n"
        "torch.cuda.synchronize()\n"
        "print(arena.offset_of(out))\n"
    )
    try:
        done = subprocess.run([sys.executable, "-c", server, str(harness_side.fd), json.dumps(layout.to_dict())],
                              pass_fds=(harness_side.fd,), capture_output=True, text=True, timeout=120,
                              cwd=Path(__file__).resolve().parents[1])
        assert done.returncode == 0, done.stderr[-2000:]
        offset = int(done.stdout.split()[-1])  # the arena holds the output: no copy was made
        got = torch.empty(1000, device="cuda")
        read_arena(harness_side.view(layout.arena), offset, got)
        assert torch.equal(got, torch.arange(3000.0, device="cuda").view(3, 1000).sum(0))
    finally:
        harness_side.close()


def test_poison_asks_for_each_freed_block_as_its_pool_serves_it():
    """A freed 2 MiB small-pool segment asked for whole would be served by the large pool, new
    memory: the H100 test saw 20 MiB more reserved and the stale block left as it was."""
    from env_pool.candidate.serve import SMALL_REQUEST, freed_block_requests

    snapshot = [
        {"segment_type": "small", "blocks": [{"state": "inactive", "size": 2 << 20}]},
        {"segment_type": "small", "blocks": [{"state": "active_allocated", "size": 4096}, {"state": "inactive", "size": 8192}]},
        {"segment_type": "large", "blocks": [{"state": "inactive", "size": 280 << 20}, {"state": "active_allocated", "size": 2 << 20}]},
        # the arena's private pool (env_pool/shared/arena.py): round data the harness reads anyway, and
        # asking for its blocks from the default pool would only allocate that much new memory
        {"segment_type": "large", "segment_pool_id": (1, 0), "blocks": [{"state": "inactive", "size": 6 << 30}]},
    ]
    assert freed_block_requests(snapshot) == [280 << 20, SMALL_REQUEST, SMALL_REQUEST, 8192]


@pytest.mark.gpu
def test_gpu_poison_fills_every_freed_block_and_holds_no_more_memory():
    """A candidate's torch.empty gets a freed block of its server's allocator: it must read NaN,
    never what the reference's build left there. Half the free memory poisoned and kept cached
    (the old way, which missed these blocks) ran the harness out of memory on KernelBench's level 1."""
    from env_pool.candidate.serve import poison_freed_memory

    sizes = [1000, 300_000, 5_000_000, 70_000_000]  # the small pool's blocks and the large pool's
    stale = [torch.full((n,), 3.0, device="cuda") for n in sizes]
    del stale
    reserved = torch.cuda.memory_reserved()
    poison_freed_memory("cuda")
    assert torch.cuda.memory_reserved() == reserved  # only the cached blocks were taken, nothing new
    again = [torch.empty(n, device="cuda") for n in sizes]
    assert all(bool(torch.isnan(t).all()) for t in again), [int((t == 3.0).sum()) for t in again]


def test_a_baselines_server_gets_its_own_host_memory_limit():
    """torch.compile of KernelBench's level2/65 took 9.4 GB of host memory on an H100 host: over
    a candidate's 8 GB, its trusted server ended out of memory and the problem had no baselines."""
    from env_pool.trusted.round_protocol import server_spec

    request = request_for(Task(id="t", level=1, source="x = 1\n"), memory_limit_mb=8192, baseline_memory_limit_mb=32768)
    rounds = SimpleNamespace(request=request, device="cpu")
    assert server_spec(rounds, trusted=True).memory_mb == 32768
    assert server_spec(rounds, trusted=False).memory_mb == 8192


def test_a_harness_that_dies_is_restarted_and_a_bad_request_does_not_kill_it(tmp_path: Path):
    harness = HarnessProcess(tmp_path / "harness.log")
    try:
        no_model = request_for(Task(id="t", level=1, source="x = 1\n"))
        first = harness.request(no_model, 120)
        assert first["failure"] == "infra" and "harness failed" in first["message"]  # the task has no Model
        assert harness.starts == 1 and harness.proc.poll() is None
        harness.proc.kill()
        harness.proc.wait()
        again = harness.request(no_model, 120)
        assert again["failure"] == "infra" and harness.starts == 2
    finally:
        harness.close()


@pytest.mark.parametrize("message, oom", [
    ("the harness failed: OutOfMemoryError: CUDA out of memory. Tried to allocate 12.00 GiB. GPU 0 has a total capacity", True),
    ("the harness failed: RuntimeError: cuMemCreate failed with CUresult 2", True),  # as the H100 sweep reported it
    ("the harness failed: RuntimeError: cuMemCreate failed with CUresult 20", False),
    ("the baselines measured implausibly", False),
])
def test_out_of_memory_is_recognised_as_torch_and_the_driver_word_it(message, oom):
    from env_pool.trusted.harness import out_of_memory

    assert out_of_memory(message) is oom


def test_the_task_cache_keeps_what_its_device_budget_holds_besides_the_newest_task():
    from env_pool.trusted import harness
    from tasks.loader import load_tasks

    tasks = {t.id: t for t in load_tasks()[0]}
    payload = {tid: request_for(tasks[tid]) for tid in ("level1/01_gelu", "level1/02_swish", "level1/03_softmax")}
    probe = harness.TaskCache()
    sizes = {tid: probe.get(p).device_bytes() for tid, p in payload.items()}
    assert all(n > 2 * 2**20 for n in sizes.values()), sizes  # the slots alone: inputs and outputs of MBs
    for rounds in probe.entries.values():
        rounds.close()
    # Room for two of the three: the oldest goes as the third comes; the newest stays whatever its size.
    cache = harness.TaskCache(budget_bytes=sizes["level1/02_swish"] + sizes["level1/03_softmax"])
    for tid in payload:
        cache.get(payload[tid])
    assert [k[0] for k in cache.entries] == ["level1/02_swish", "level1/03_softmax"]
    tiny = harness.TaskCache(budget_bytes=1)
    for tid in payload:
        tiny.get(payload[tid])
    assert [k[0] for k in tiny.entries] == ["level1/03_softmax"]
    assert harness.TaskCache().budget_bytes is None and harness.device_budget("cpu") == float("inf")


def test_a_request_out_of_device_memory_is_tried_again_without_the_other_cached_tasks(monkeypatch):
    """Real cached tasks (references, round memory); the device's OOM itself cannot happen on this CPU machine."""
    from env_pool.trusted import harness
    from tasks.loader import load_tasks

    tasks = {t.id: t for t in load_tasks()[0]}
    payload = {tid: request_for(tasks[tid]) for tid in ("level1/01_gelu", "level1/02_swish")}
    cache = harness.TaskCache()
    cache.get(payload["level1/02_swish"])
    seen = []

    def evaluate_rounds(rounds, pool, request):
        seen.append(sorted(k[0] for k in cache.entries))
        if len(seen) == 1:
            return {"ok": False, "failure": "infra", "message": "the harness failed: RuntimeError: cuMemCreate failed with CUresult 2"}
        return {"ok": True}

    monkeypatch.setattr(harness, "evaluate_rounds", evaluate_rounds)
    assert harness.handle(payload["level1/01_gelu"].to_wire(), cache, None) == {"ok": True}
    assert seen == [["level1/01_gelu", "level1/02_swish"], ["level1/01_gelu"]], "tried again with the others dropped"
    seen.clear()
    verdict = harness.handle(payload["level1/01_gelu"].to_wire(), cache, None)
    assert verdict["failure"] == "infra" and len(seen) == 1, "alone in the cache, an OOM is the verdict: no loop"


def test_a_server_frozen_between_ready_and_its_first_spin_still_serves_the_round(monkeypatch):
    """The harness freezes a server as soon as it sees READY and writes GO while it is frozen.

    A server that read GO's starting value only after READY woke to the round's nonce already
    there and waited for a change that never came (~1 corpus verification in 70 hung to its
    wall limit). Here the harness's whole round start lands at that worst moment: in the
    server's own write of READY.
    """
    from env_pool.candidate import serve
    from env_pool.shared.rounds import CALLS, DONE, STAMP_WORDS, STAMPS, STOP
    from tasks.loader import load_tasks

    nonce = (1 << 61) | 12345

    class FrozenAtReady(Control):
        def __init__(self, fd: int):
            super().__init__(fd)
            self.words = _GoAtReady(self.words, nonce)

    task = {t.id: t for t in load_tasks()[0]}["level1/17_relu"]
    x = torch.rand(64)
    layout = plan_layout([x], [torch.relu(x)], "cpu")
    control, memory = Control.create(), SlotMemory.create(layout.size, "cpu")
    control.words[CALLS] = 1  # as the harness's prepare() writes it before each round
    monkeypatch.setattr(serve, "Control", FrozenAtReady)
    payload = {"task": task.to_dict(), "backend": "cpp", "threads": 1, "phases": ["null"], "rules": "strict",
               "layout": layout.to_dict(), "init_seed": 0, "watched": False,
               "control_fd": control.fd, "slots_fd": memory.fd}
    server = threading.Thread(target=serve.serve, args=(payload, {}), daemon=True)
    try:
        began = time.perf_counter_ns()
        server.start()
        deadline = time.monotonic() + 30
        while control.words[DONE] != nonce and time.monotonic() < deadline:
            time.sleep(0.01)
        assert control.words[DONE] == nonce, "the server never served the round whose GO came while it was frozen"
        stamps = [control.words[STAMPS + i] for i in range(STAMP_WORDS)]  # its wake, outputs placed, device synced: the harness's log
        assert began <= stamps[0] <= stamps[1] <= stamps[2] <= time.perf_counter_ns(), stamps
        control.words[GO] = STOP
        server.join(30)
        assert not server.is_alive()
    finally:
        control.words[GO] = STOP
        server.join(5)
        control.close()
        memory.close()
        os.close(control.fd)


class _GoAtReady:
    """The server's view of the control words, with the harness's GO written in the same instant as READY."""

    def __init__(self, words, nonce: int):
        self.words, self.nonce = words, nonce

    def __getitem__(self, index: int) -> int:
        return self.words[index]

    def __setitem__(self, index: int, value: int) -> None:
        self.words[index] = value
        if index == READY and value > 0:
            self.words[GO] = self.nonce


def test_a_request_is_served_on_the_harness_cpus_and_the_thread_freed_after():
    # The harness spins through every round on the thread that serves the request: off the servers'
    # CPUs, whoever started it (a harness in the worker's own process was not pinned at all).
    from env_pool.trusted.harness import on_cpus
    mine = os.sched_getaffinity(0)
    one = (max(mine),)
    seen = {}
    with on_cpus(one):
        seen["serving"] = os.sched_getaffinity(0)
        started = threading.Thread(target=lambda: seen.update(started=os.sched_getaffinity(0)))
        started.start()
        started.join()
    assert seen == {"serving": set(one), "started": set(one)}
    assert os.sched_getaffinity(0) == mine
    assert request_for().harness_cpus  # the worker always names them (evaluate.split_cpus)
