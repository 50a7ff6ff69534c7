"""The round protocol, trusted side: one server taken through its phases, each round on the harness's clock.

TRUSTED SIDE (the harness process, env_pool/trusted/harness.py, which turns what this measures
into a verdict). ``Rounds`` holds one task's reference, inputs and shared round memory
(slots for each of a round's calls, ``choose_calls``);
``serve_phases`` claims a server (env_pool/trusted/server_pool.py), gives it its run and serves
it each phase's rounds: inputs written while it is frozen, GO, DONE, frozen again, outputs read
where it left them and checked. ``net_timing`` takes the protocol's own cost, as the null
phase measured it, out of the rounds' times; ``above_protocol_noise`` says whether what is left
can be a kernel's.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import itertools
import math
import os
import secrets
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import msgpack
import torch

from env_pool.candidate.seccomp import KILL_SIGNAL
from env_pool.isolation.sandbox import SandboxOutcome
from env_pool.shared.inputs import make_model
from env_pool.shared.profile import CacheFlusher, synchronize
from env_pool.shared.rounds import (CALLS, DONE, GO, MAX_OUTPUTS, NOWHERE, OUTS, READY, STAMP_WORDS, STAMPS, STOP, Control,
                                    SlotMemory, next_phase, plan_layout)
from env_pool.trusted.awake_cpus import Awake
from env_pool.trusted.code_sampler import CodeIdentity, CodeLedger, CpuSampler, Disturbance, PhaseSampling, SamplerUnavailable
from env_pool.trusted.harness_request import HarnessRequest
from env_pool.trusted.readout import Unreadable, read_arena, read_process
from env_pool.trusted.server_pool import Server, ServerPools, ServerSpec, log
from env_pool.trusted.verify import Variation, check_outputs
from protocol.results import InputCheck, Timing
from tasks.discriminate import Discrimination, plan, transform_inputs
from tasks.rules import rules_named
from tasks.task import Task, build_problem


SPIN_CHECK = 4096  # spins between checks of the server's liveness and the deadline
MIN_NET_MS = 1e-3  # a round no slower than the protocol's own cost reads as 1 us, not 0 or less
NULL_ROUNDS = 5  # the null phase's rounds in verify mode (full mode times warmup + repetitions of them)
STAGING_FLOOR = 0.25  # a net time under this fraction of the round's input and output copies is not a kernel's
VARIATION_ROUNDS = 5  # checked rounds of the "does the output vary with the inputs" test
ROUND_TARGET_MS = 10.0  # calls_per_round=0 on a GPU: a timed round's share of the reference's time, at least
MAX_CALLS = 32  # ... and at most this many calls a round (each is checked: the harness runs the reference on each)
OOM_SIGNS = ("can't allocate memory", "CUDA out of memory", "OutOfMemoryError", "bad_alloc", "MemoryError")


class RoundsFailed(Exception):
    """The candidate failed: ``kind`` is one of results.FAILURE_KINDS."""

    def __init__(self, kind: str, message: str, output: str = ""):
        super().__init__(message)
        self.kind = kind
        self.output = output  # the server's stdout and stderr, trimmed
        self.violations: list[dict] = []  # what the server's guards flagged (untrusted: they can only fail it)


@dataclass
class PhaseRun:
    """What the harness measured of one phase: raw round times (ns) and the checks it made."""

    samples_ns: list[int] = field(default_factory=list)
    staging_ns: list[int] = field(default_factory=list)  # the harness's input writes and output reads, per round
    # ... split: its input writes (synced), its output reads launched, their sync; for the log only
    # (a real round's staging runs longer than a null one's on a GPU, and only the null's is subtracted)
    staging_split_ns: list[tuple[int, int, int]] = field(default_factory=list)
    settle_ns: list[int] = field(default_factory=list)  # DONE until the server was frozen: its own, never subtracted
    # A passed round's GO until DONE, split at the thaw's return and at the server's own stamps
    # (its wake, its outputs placed, its device synced: untrusted); the last four terms sum to
    # GO until DONE. For the log that says where a round's time went (issue 34's fidelity gap on
    # the GPU). Never part of any reward.
    split_ns: list[tuple[int, ...]] = field(default_factory=list)
    checks: list[InputCheck] = field(default_factory=list)
    outputs: Variation = field(default_factory=Variation)  # the server's, over the first VARIATION_ROUNDS checked rounds
    expected: Variation = field(default_factory=Variation)  # the reference's, over the same rounds
    mutated: bool = False
    code: CodeLedger | None = None  # where the server's CPU time went in the rounds (a candidate's server only)
    disturbance: Disturbance | None = None  # builds on the timing CPUs during the rounds (a trusted server's)


class Rounds:
    """Fresh inputs, the reference, and the shared memory of one evaluation."""

    def __init__(self, request: HarnessRequest):
        self.request = request  # the current evaluation's (limits, CPUs, folders); set anew for each
        self.rules = rules_named(request.rules)
        task = Task.from_dict(request.task)
        atol, rtol = self.rules.tolerances(task.atol, task.rtol)
        self.task = dataclasses.replace(task, atol=atol, rtol=rtol)  # checked under the rules in force
        self.backend = request.backend
        self.device = "cuda" if self.backend == "cuda" else "cpu"
        torch.set_num_threads(request.threads)
        set_tf32(self.rules.tf32)
        self.problem = build_problem(self.task, self.backend)
        self.init_seed = secrets.randbits(62)
        self.reference = make_model(self.problem, self.init_seed, self.device)
        first = self.fresh_inputs()
        outputs, peak = self._reference_peak(first)
        if not all(isinstance(o, torch.Tensor) for o in outputs):
            raise RuntimeError("the task's reference returns something other than tensors; the environment times tensors only")
        call_bytes = sum(t.numel() * t.element_size() for t in [*first, *outputs] if isinstance(t, torch.Tensor))
        call_ms = self._reference_ms(first) if self.device == "cuda" and request.calls_per_round <= 0 else 0.0
        self.calls = choose_calls(request, self.device, call_ms, call_bytes, len(outputs))
        self.layout = plan_layout(first, outputs, self.device, peak, self.calls)
        self.scalars = [a.get("value") for a in self.layout.args]
        self.memory = SlotMemory.create(self.layout.size, self.device)
        self.arg_views = self.slot_views(self.memory)
        # A GPU's arena, where the server's round allocates (env_pool/shared/arena.py): NaN (0xFF bytes)
        # to start with, so an output that was never written cannot pass.
        self.arena = self.memory.view(self.layout.arena).fill_(0xFF) if self.device == "cuda" else None
        # Where each round's outputs are read to (each call's), allocated once: a fresh allocation
        # inside the timed window would add page faults (CPU) or allocator work to every round.
        self.snapshots = [[torch.empty(s.shape, dtype=s.torch_dtype, device=self.device) for s in self.layout.outputs]
                          for _ in range(self.calls)]
        self.flusher = CacheFlusher(self.device)
        self._discrimination: Discrimination | None = None
        self.awake = Awake()  # the request's spinners on the servers' CPUs (harness._attempt), asleep in each round (awake_cpus.Awake)

    def _reference_peak(self, inputs: list[Any]) -> tuple[list[Any], int]:
        """The reference's outputs on ``inputs``, and on a GPU the most device memory its forward held at once."""
        if self.device != "cuda":
            with torch.no_grad():
                return _as_list(self.reference(*inputs)), 0
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with torch.no_grad():
            outputs = _as_list(self.reference(*inputs))
        torch.cuda.synchronize()
        return outputs, max(0, torch.cuda.max_memory_allocated() - before)

    def _reference_ms(self, inputs: list[Any]) -> float:
        """The reference's time for one call on a GPU, warm, the median of three: what choose_calls sizes a round by."""
        times = []
        with torch.no_grad():
            for _ in range(3):
                synchronize(self.device)
                begin = time.perf_counter()
                self.reference(*inputs)
                synchronize(self.device)
                times.append((time.perf_counter() - begin) * 1e3)
        return statistics.median(times)

    def device_bytes(self) -> int:
        """What this task keeps on its device between evaluations: slots, snapshots, the reference, the flush buffer."""
        tensors = [*(t for call in self.snapshots for t in call), *self.reference.parameters(), *self.reference.buffers(),
                   self.flusher.buffer]
        return self.memory.size + sum(t.numel() * t.element_size() for t in tensors)

    def close(self) -> None:
        self.memory.close()
        os.close(self.memory.fd)

    def fresh_inputs(self) -> list[Any]:
        """One call's arguments from a seed that never leaves this process, made on the device."""
        # The generators that make them, seeded directly: torch.manual_seed also queues seeds for
        # every other device kind, each with a formatted stack (a millisecond a round on the CPU).
        seed = secrets.randbits(62)
        torch.default_generator.manual_seed(seed)
        if self.device == "cuda":
            torch.cuda.manual_seed(seed)
        with torch.device(self.device):
            values = self.problem.get_inputs()
        return [v.to(self.device) if isinstance(v, torch.Tensor) else v for v in values]

    def discrimination(self) -> Discrimination:
        """The transformed sets this task's verification needs (tasks/discriminate.py), decided once per task."""
        if self._discrimination is None:
            def run(inputs: list[Any]) -> list[torch.Tensor]:
                with torch.no_grad():
                    return [o.detach() for o in _as_list(self.reference(*inputs))]

            self._discrimination = plan(run, self.fresh_inputs, lambda dtype: self.task.tolerances(str(dtype).removeprefix("torch.")),
                                        seed=secrets.randbits(40))
        return self._discrimination

    def transformed(self, name: str) -> Callable[[], list[Any]]:
        """A round's set: fresh inputs through a discriminating transform, made when its round comes."""
        return lambda: transform_inputs(name, self.fresh_inputs(), secrets.randbits(40))

    def null_rounds(self, count: int) -> list[Callable[[], list[Any]]]:
        """The null phase's rounds: one input set per call of a round (Rounds.calls), the same each
        round, written into the slots as any round's.

        Its server computes nothing from them (it is served before a candidate's code loads), so
        fresh ones would only cost their making: a third of a second of a cpp full evaluation.
        A set of each call's own, not one written to every call's slots: with four calls a round
        of a 64 MB GEMM output, one set copied four times (and one output read four times) came
        from the device's cache, and the null rounds' copies took 0.4 ms less than a real round's.
        """
        sets = itertools.cycle([self.fresh_inputs() for _ in range(self.calls)])
        return [lambda: next(sets)] * count

    def read_outputs(self, server: Server, control: Control, calls: int) -> None:
        """Each call's outputs from where the frozen server says they lie, into its snapshots; an unreadable place is wrong."""
        pid = server.start.program_pid() if self.arena is None else None
        count = len(self.layout.outputs)
        for call, k in ((c, k) for c in range(calls) for k in range(count)):
            snapshot, where = self.snapshots[call][k], int(control.words[OUTS + call * count + k])
            try:
                if self.arena is not None:
                    read_arena(self.arena, where, snapshot)
                elif pid is None:
                    raise ServerGone()
                else:
                    read_process(pid, where, snapshot)
            except Unreadable as err:
                of = f" of call {call}" if calls > 1 else ""
                raise RoundsFailed("wrong", f"output {k}{of} could not be read where the server put it: {err}") from err
            except ProcessLookupError as err:
                raise ServerGone() from err

    def prepare(self, sets: list[list[Any]], control: Control) -> int:
        """Everything before a round's clock starts (``sets``: each call's inputs); returns the round's nonce.

        The caches are flushed (every round starts cold) before the clock, and the inputs
        written only after it starts, while the server is frozen: a server that watches the
        slots can do nothing ahead of time (corpus rt_prestage_watcher computes during the flush
        if it can; rt_prestage_predone, as the inputs land). The nonce is unguessable and DONE is
        cleared: a DONE written before GO, or left by another server, never matches it; the
        OUTS words are cleared, so a server that places nothing is read from nowhere.
        """
        for value, scalar in ((v, c) for inputs in sets for v, c in zip(inputs, self.scalars)):
            if scalar is not None and value != scalar:
                raise RuntimeError("the task's non-tensor inputs change from call to call; the environment holds them constant")
        self.flusher()
        control.words[DONE] = 0
        for i in range(STAMP_WORDS):
            control.words[STAMPS + i] = 0
        for k in range(len(sets) * len(self.layout.outputs)):
            control.words[OUTS + k] = NOWHERE
        control.words[CALLS] = len(sets)
        synchronize(self.device)
        return secrets.randbits(62) | (1 << 61)

    def slot_views(self, memory: SlotMemory) -> list[list[torch.Tensor | None]]:
        """Each call's forward arguments' slots in ``memory`` (None for a constant)."""
        return [[memory.view(a["slot"]) if "slot" in a else None for a in self.layout.call_args(call)]
                for call in range(self.calls)]

    def write_inputs(self, sets: list[list[Any]], views: list[list[torch.Tensor | None]]) -> None:
        """Each call's inputs into its slots (``views``, from slot_views)."""
        for view, value in ((v, x) for call_views, inputs in zip(views, sets) for v, x in zip(call_views, inputs)):
            if view is None:
                continue
            if self.device == "cpu" and value.is_contiguous() and value.dtype == view.dtype:
                # libc's copy: a tenth of torch's time for 16 MB on the 2-core machine, and steadier
                ctypes.memmove(view.data_ptr(), value.data_ptr(), value.numel() * value.element_size())
            else:
                view.copy_(value)
        synchronize(self.device)

    @staticmethod
    def wait_done(control: Control, thread: threading.Thread, nonce: int, sampling: PhaseSampling | Disturbance | None) -> int:
        words = control.words
        spins = 0
        while True:
            done = words[DONE]
            if done == nonce or done == -nonce:
                return done
            spins += 1
            if spins % SPIN_CHECK == 0:
                if not thread.is_alive():
                    raise ServerGone()
                if sampling is not None:
                    sampling.poll()

    def check(self, run: PhaseRun, inputs: list[Any], snapshot: list[torch.Tensor], label: str, index: int) -> None:
        """One call's outputs against the reference's on its inputs, recorded as round ``index``'s."""
        # On the device: every round is checked, and a 128 MB output compared in float64 on the
        # host costs seconds a round (40 rounds of a level-1 GPU preset ran past the time limit).
        with torch.no_grad():
            expected = [o.detach() for o in _as_list(self.reference(*inputs))]
        got = snapshot
        check = check_outputs(index, self.task, expected, got)
        check.inputs = label
        run.checks.append(check)
        if len(run.checks) <= VARIATION_ROUNDS:
            run.outputs.add(got, copy=True)  # the snapshots are the next round's too
            run.expected.add(expected)
        if not check.passed:
            on = "" if label == "own" else f" (inputs: {label})"
            raise RoundsFailed("wrong", f"wrong on round {check.index}{on}: {check.reason}")

def wait_ready(control: Control, phase: int, thread: threading.Thread, trusted: bool) -> None:
    """Wait for the server's phase; a failed build is the candidate's in a server that loads its code.

    Such a server never reports "infra": whatever it writes may be the candidate's forgery (a
    ModelNew can raise serve.py's own RoundError("infra")). The one real infra cause
    there, a seccomp filter that will not install, is ruled out by seccomp_works() beforehand.
    """
    words = control.words
    while words[READY] not in (phase + 1, -(phase + 1)):
        if not thread.is_alive():
            raise ServerGone()
        time.sleep(0.001)  # model builds take seconds: no need to spin here
    if words[READY] < 0:
        kind, message = _kind_and_message(control.message(), "crash")
        if trusted:
            raise RoundsFailed(kind if kind in ("infra", "out_of_memory") else "infra", message)
        raise RoundsFailed({"import": "compile_error", "out_of_memory": "out_of_memory"}.get(kind, "crash"), message)


def choose_calls(request: HarnessRequest, device: str, call_ms: float, call_bytes: int, outputs: int) -> int:
    """A timed round's forward calls: env.calls_per_round, or (0) as many as fill ROUND_TARGET_MS of the
    reference's time ``call_ms`` on a GPU, at most MAX_CALLS, within env.round_memory_mb of inputs and
    outputs (``call_bytes`` a call); one on the CPU.

    Each round pays a fixed cost around its calls: the thaw, the server's wake, a first launch from
    a cold host, the device sync, DONE. One call a round paid all of it on every call, and on an
    H100 put a 3 ms GELU kernel's speedup 8.6% under do_bench's (whose back-to-back calls hide their
    launches behind the previous call's work), the candidate's cold forward taking 0.56 ms of host
    time against eager's 0.38.
    """
    most = MAX_OUTPUTS // max(1, outputs)
    if request.calls_per_round > 0:
        if request.calls_per_round > most:
            raise RuntimeError(f"env.calls_per_round={request.calls_per_round}: this task's {outputs} output(s) allow at most "
                               f"{most} calls a round; set it to {most} or less, or to 0 (chosen per task)")
        return request.calls_per_round
    if device != "cuda":
        return 1
    calls = math.ceil(ROUND_TARGET_MS / max(call_ms, 1e-3))
    return max(1, min(calls, MAX_CALLS, most, (request.round_memory_mb << 20) // max(1, call_bytes)))


def set_tf32(allowed: bool) -> None:
    """TF32 as torch leaves it (the paper's rules: cuDNN's convolutions on, matmuls off), or off
    everywhere (the strict rules: TF32 misses a 1e-4 tolerance by 4-77x on float32 GEMMs and convolutions)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = allowed


class ServerGone(Exception):
    """The server's process ended while the harness waited on it; its outcome says why."""


def server_spec(rounds: Rounds, trusted: bool) -> ServerSpec:
    """The start settings of the request's server (servers are pooled by them).

    A trusted server's own folder is beside the request's private one, hidden from candidates;
    a candidate's is beside its scratch folder.
    """
    r = rounds.request
    return ServerSpec(device=rounds.device, threads=r.threads, memory_mb=r.server_memory_mb(trusted),
                      wall_s=r.server_timeout_s(trusted), hidden=() if trusted else r.hidden,
                      required=() if trusted else r.required_isolation, cpus=r.cpus, startup_cpus=r.startup_cpus,
                      trusted=trusted, inductor_dir=r.inductor_dir if trusted else "",
                      root=str(Path(r.reference_cwd if trusted else r.scratch).parent))


def claim_server(rounds: Rounds, pools: ServerPools, cwd: Path, trusted: bool) -> Server:
    """A server for this request, waiting or started now; a candidate's gets the candidate's files copied in."""
    server = pools.of(trusted).take(server_spec(rounds, trusted), rounds.request.waiting_servers(trusted))
    if not trusted:
        server.take_files(cwd)
    return server


def give_run(rounds: Rounds, server: Server, control: Control, memory: SlotMemory, phases: list[str], trusted: bool) -> None:
    r = rounds.request
    payload = {"task": r.task, "backend": rounds.backend, "threads": r.threads, "phases": phases, "rules": rounds.rules.name,
               "layout": rounds.layout.to_dict(), "init_seed": rounds.init_seed, "compile_mode": r.compile_mode,
               "seccomp": r.seccomp, "watched": not trusted, "timed": r.mode != "verify"}
    for word in (GO, READY, DONE):  # a fresh run: nothing an earlier server wrote counts (a planted GO included)
        control.words[word] = 0
    control.set_message("")
    server.give(payload, (control.fd, memory.fd))


@functools.lru_cache(maxsize=None)
def seccomp_works() -> bool:
    """Whether the server's seccomp filter installs here: tried once, in a throwaway trusted process."""
    probe = subprocess.run([sys.executable, "-c", "from env_pool.candidate.seccomp import forbid_processes; forbid_processes()"],
                           capture_output=True, timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    return probe.returncode == 0


def open_sampler(request: HarnessRequest) -> CpuSampler | None:
    """The code sampler on the servers' CPUs and the harness's own (every server's: they all run
    under the same sampling; the harness's, where a build would slow the clock).

    Required unless ``code_sampling`` is off: without it nothing outside the candidate's process
    tells torch's or a library's code from the candidate's, so the run is refused as infra.
    """
    if not request.code_sampling:
        return None
    cpus = list(request.cpus)
    if not cpus:
        raise RoundsFailed("infra", "the code sampler needs the servers' CPUs (the request's cpus), and none were given")
    try:
        return CpuSampler(sorted(set(cpus) | os.sched_getaffinity(0)))
    except (SamplerUnavailable, OSError) as err:
        raise RoundsFailed("infra", f"the harness's code sampler cannot run here: {err}. Candidates are not run "
                                    "without it (env.code_sampling=false turns it off, for comparisons only)") from err


Phase = tuple[str, list | int, bool, list[str] | None]  # name, its rounds, checked, each round's kind of set


def serve_phases(rounds: Rounds, pools: ServerPools, phases: list[Phase], cwd: Path,
                 trusted: bool) -> tuple[dict, dict]:
    """Run a server through its phases, each one's rounds with the pool quiet (waiting servers
    paused for timed rounds), Rounds.calls calls a round; (PhaseRun per phase name, the server's report).

    Only the rounds are paused: the wait for a phase (the server's own start-up when it was
    taken before it finished, its model build, a baseline's torch.compile) and the server's
    exit are untimed, and the waiting servers' start-ups go on meanwhile. Paused through those
    too, start-ups could only progress between evaluations: each warm full-mode evaluation on
    the H100 then waited ~12 s for the start-up of the server it took.
    """
    session = Session(rounds, pools, [phase[0] for phase in phases], cwd, trusted)
    with session:
        for _, todo, check, labels in phases:
            session.begin(todo if isinstance(todo, int) else len(todo))
            with pools.quiet(session.timed):
                session.serve(todo, check, labels, rounds.calls)
            session.end()
        return session.finish()


class Session:
    """One server taken through its phases a step at a time, on a control block of its own.

    ``serve_phases`` takes one server through all of its phases in turn; the harness's
    interleaved timing (env_pool/trusted/turns.py) holds several, each frozen in its phase, and
    serves their rounds in turn. A step that fails records why (``failure``, or the server gone)
    and makes the later ones no-ops; ``finish`` ends the server and says what its failure was.
    A candidate's server has each phase's CPU samples attributed (PhaseRun.code); the identity
    of its own kernel.so is taken before the server is given its run.
    """

    def __init__(self, rounds: Rounds, pools: ServerPools, phases: list[str], cwd: Path, trusted: bool,
                 own_memory: bool = False):
        self.rounds, self.pools, self.phases, self.trusted = rounds, pools, phases, trusted
        self.timed = rounds.request.mode == "full" or trusted
        self.runs: dict[str, PhaseRun] = {}
        self.run: PhaseRun | None = None  # the phase begun
        self.sampling: PhaseSampling | Disturbance | None = None
        self.failure: RoundsFailed | None = None
        self.gone = False  # its process ended while the harness waited on it (its outcome says why)
        self.began = False  # it said READY for its first phase (the null phase: no candidate code before it)
        self.freezer = self.server = self.identity = None
        self.stopped = False
        self.control = Control.create()
        # Slots of its own (the CPU only, where outputs are read from the server's memory): a server
        # beside another's rounds (in turn) must not share the memory the other's inputs are written
        # to. A candidate that punched holes in shared slots (fallocate, MADV_REMOVE) after its round
        # had the next round, a baseline's, fault every input page back in on the baseline's clock.
        self.own_memory = SlotMemory.create(rounds.layout.size, "cpu") if own_memory else None
        self.memory = self.own_memory or rounds.memory
        self.arg_views = rounds.slot_views(self.memory) if own_memory else rounds.arg_views
        self.sampler = None
        try:
            self.sampler = open_sampler(rounds.request)
            self.server = claim_server(rounds, pools, cwd, trusted)
            if self.sampler is not None and not trusted:
                self.identity = CodeIdentity.for_scratch(self.server.cwd, rounds.rules)
            give_run(rounds, self.server, self.control, self.memory, phases, trusted)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def ok(self) -> bool:
        return self.failure is None and not self.gone

    @property
    def name(self) -> str:
        return "the baselines' server" if self.trusted else "the candidate's server"

    def _step(self, work: Callable[[], None]) -> bool:
        """``work`` unless an earlier step failed; whether the server is still fine."""
        if self.ok:
            try:
                work()
            except RoundsFailed as err:
                self.failure = err
            except ServerGone:
                self.gone = True
        return self.ok

    def begin(self, count: int) -> bool:
        """Wait for the next phase (its model built) and freeze the server in it; its ``count`` rounds sampled."""
        return self._step(lambda: self._begin(count))

    def _begin(self, count: int) -> None:
        server, index = self.server, len(self.runs)
        wait_ready(self.control, index, server.thread, self.trusted)
        self.began = True
        self.freezer = server.start.freezer  # set as its sandbox started: long before it could say READY
        if self.freezer is None:  # cgroup-freeze is required of every server (server_pool.Server): the sandbox's fault
            raise RoundsFailed("infra", "the server's sandbox has no freezer (cgroup v2's cgroup.freeze or the v1 "
                                        "freezer): its rounds cannot be confined to their timed window")
        if not self.freezer.freeze(server.thread.is_alive):  # still from here until its first round's GO
            raise ServerGone()
        if self.sampler is None:
            self.sampling = None
        elif self.identity is not None:  # a candidate's server: which code did the work
            self.sampler.record_mappings(True)  # before PhaseSampling reads the maps: no change goes unrecorded
            self.sampling = PhaseSampling(self.sampler, server.pids(), self.identity, count)
        else:  # a trusted server's: whether a build disturbed the rounds (no mappings read: none recorded)
            self.sampling = Disturbance(self.sampler, server.pids())
        self.run = PhaseRun(code=self.sampling.ledger if self.sampling is not None else None,
                            disturbance=self.sampling if isinstance(self.sampling, Disturbance) else None)

    def serve(self, rounds: list[list[Any] | Callable[[], list[Any]] | None] | int, check: bool,
              labels: list[str] | None = None, calls: int = 1) -> bool:
        """Serve ``rounds`` to the frozen phase begun, each timed into its run: input sets (None: fresh;
        a function: the set it makes, made when its round comes), or a count of fresh ones. ``labels``
        name each round's kind of set in its check ("own" where none is given). Each round makes
        ``calls`` forward calls, each on a set of its own: a function makes each call's (the null phase's
        cycles through its calls' sets), a given set is repeated.

        A round, on the harness's clock: the inputs written (the server frozen: nothing of it runs
        while they land), GO, the server thawed; its DONE; the server frozen, the outputs read
        where it left them (env_pool/trusted/readout.py); the clock stopped. So the candidate computes
        only inside its window, and a result not finished by DONE is read unfinished. With the
        sampler, the servers' CPUs are sampled from GO until the server is frozen again (all the
        time it can run in a round), and each round's samples attributed after the round.
        """
        todo = rounds if isinstance(rounds, list) else [None] * rounds
        named = labels or ["own"] * len(todo)
        return self._step(lambda: [self._round(given, check, label, calls) for given, label in zip(todo, named)])

    def _round(self, given: list[Any] | Callable[[], list[Any]] | None, check: bool, label: str, calls: int) -> None:
        r, run, control, sampler, sampling = self.rounds, self.run, self.control, self.sampler, self.sampling
        sets = [given() if callable(given) else given if given is not None else r.fresh_inputs() for _ in range(calls)]
        nonce = r.prepare(sets, control)
        start = time.perf_counter_ns()
        r.write_inputs(sets, self.arg_views)  # inside the window, the server frozen: no round's inputs exist before its clock runs
        if sampler is not None:
            sampler.enable(True)
        r.awake.round_begun()  # they spin on until the server takes their CPUs: none halts before its wake
        go_at = time.perf_counter_ns()
        control.words[GO] = nonce
        self.freezer.thaw()
        thawed_at = time.perf_counter_ns()
        try:
            status = r.wait_done(control, self.server.thread, nonce, sampling)
            done_at = time.perf_counter_ns()
            if not self.freezer.freeze(self.server.thread.is_alive):
                raise ServerGone()
            frozen_at = time.perf_counter_ns()
        finally:
            r.awake.round_over()
        if sampler is not None:
            sampler.enable(False)
        if status >= 0:
            r.read_outputs(self.server, control, calls)
        read_at = time.perf_counter_ns()
        synchronize(r.device)
        end = time.perf_counter_ns()
        run.samples_ns.append(end - start)
        run.staging_ns.append((go_at - start) + (end - frozen_at))
        run.staging_split_ns.append((go_at - start, read_at - frozen_at, end - read_at))
        run.settle_ns.append(frozen_at - done_at)
        if status >= 0:
            woke, placed, synced = (control.words[STAMPS + i] for i in range(STAMP_WORDS))
            run.split_ns.append((thawed_at - go_at, woke - go_at, placed - woke, synced - placed, done_at - synced))
        if sampling is not None:  # all the server could run in the round: GO until it was frozen again
            sampling.round_done(go_at, frozen_at)
        if status < 0:
            kind, message = _kind_and_message(control.message(), "crash")
            raise RoundsFailed(kind if kind in ("wrong", "out_of_memory") else "crash", message)
        run.mutated |= any(v is not None and not torch.equal(v, x)
                           for views, inputs in zip(self.arg_views, sets) for v, x in zip(views, inputs))
        if check:
            index = len(run.checks)  # the round's, whichever of its calls fails
            for inputs, snapshot in zip(sets, r.snapshots):
                r.check(run, inputs, snapshot, label, index)
            if calls > 1:  # one record a round, its calls' worst error: 32 calls a round made thousands a run
                merged = run.checks[-calls:]
                del run.checks[-calls:]
                worst = max((c.max_abs_error for c in merged if c.max_abs_error is not None), default=None)
                run.checks.append(dataclasses.replace(merged[0], max_abs_error=worst))

    def end(self) -> bool:
        """The phase begun ends: the server goes on to its next one (or stops after its last)."""
        return self._step(self._end)

    def _end(self) -> None:
        index, run = len(self.runs), self.run
        self.runs[self.phases[index]] = run
        log(f"  {self.phases[index]}: rounds {_ms(run.samples_ns)}, of which the harness's {_ms(run.staging_ns)} "
            f"({_split(run.staging_split_ns, STAGING_SPLIT)}), "
            f"GO to DONE {_ms([sum(row[1:]) for row in run.split_ns])} ({_split(run.split_ns)}), "
            f"DONE to frozen {_ms(run.settle_ns)} (medians, ms); its threads {thread_census(self.server)}")
        if self.sampler is not None and self.identity is not None:
            self.sampler.record_mappings(False)
        self.control.words[GO] = next_phase(index) if index + 1 < len(self.phases) else STOP
        self.freezer.thaw()

    def finish(self) -> tuple[dict, dict]:
        """The server ended and its outcome read: (PhaseRun per phase name, the server's report), or
        its failure raised; the outcome's first (a kill explains a failed round)."""
        self._stop()
        server, trusted, failure = self.server, self.trusted, self.failure
        if "error" in server.box:
            raise server.box["error"]
        report = _untrusted_report(server.outcome)
        report["output"] = server.outcome.output[-4000:]
        report["warm_server"] = server.warm  # the harness's own fact, beside the server's parsed words
        who = self.name if trusted else "the candidate"  # whom a failure message blames
        log(f"  {self.name}: highest host memory seen {server.outcome.peak_memory_mb:.0f} MB")  # beside its limit (memory_limit)
        failure = _outcome_failure(server.outcome, report, failure, self.rounds.request.seccomp, who,
                                   self.rounds.request.server_memory_mb(trusted)) or failure
        if failure is not None and failure.kind == "timeout" and not self.began:
            # No candidate code runs before the first phase's READY (the null phase's): a server that
            # never got there is the environment's, retried as infra.
            failure = RoundsFailed("infra", f"{self.name} never began its first phase (no candidate code had run): "
                                            "the environment's fault")
        if failure is None and not trusted and not report["readable"]:
            failure = RoundsFailed("crash", "the server's report was missing or unreadable (its result channel was written to)")
        if failure is not None:
            failure.output, failure.violations = report["output"], report["violations"] + failure.violations
            raise failure
        if len(self.runs) < len(self.phases):
            raise RoundsFailed("crash", "the server stopped before its rounds were done")
        return self.runs, report

    def _stop(self) -> None:
        """STOP, the server thawed and its process awaited (once)."""
        if self.server is None or self.stopped:
            return
        self.stopped = True
        if not self.server.start.given:  # never given its run: server.finish() cancels it (a join would wait for ever)
            return
        self.control.words[GO] = STOP
        if self.freezer is not None:
            self.freezer.thaw()
        self.server.thread.join()

    def close(self) -> None:
        """Everything the session holds released (the server stopped first, if it was not)."""
        try:
            self._stop()
        finally:
            if self.sampler is not None:
                self.sampler.close()
                self.sampler = None
            if self.identity is not None:
                self.identity.close()
                self.identity = None
            if self.server is not None:
                self.server.finish()
                # a no-op where take() refilled already (a harness with CPUs to spare)
                self.pools.of(self.trusted).refill(self.rounds.request.waiting_servers(self.trusted))
                self.server = None
            self.arg_views = []  # its own slots' views gone first: a mapping with live views cannot be closed
            for block in (self.control, self.own_memory):
                if block is not None:
                    block.close()
                    os.close(block.fd)
            self.control = self.own_memory = None


def _outcome_failure(outcome: SandboxOutcome, report: dict, failure: RoundsFailed | None, seccomp_on: bool,
                     who: str, memory_mb: int) -> RoundsFailed | None:
    """A failure read from how the server's process ended (it beats a failed round: a kill explains it)."""
    if outcome.signal_name == KILL_SIGNAL and seccomp_on:
        reason = ("tried to start a process or run a program from native code (fork, exec or system()): "
                  "the seccomp filter killed it with SIGSYS")
        killed = RoundsFailed("guard", f"rejected: [subprocess] {reason}")
        killed.violations = [{"guard": "subprocess", "reason": reason}]
        return killed
    if outcome.failure in ("timeout", "out_of_memory"):
        # Over the host limit, or a failed allocation of either memory; the peak is the watchdog's
        # last poll, so a kill between two polls (the cgroup's) reads below the limit.
        memory = f"ran out of memory (host limit {memory_mb} MB, highest seen {outcome.peak_memory_mb:.0f} MB)"
        what = {"timeout": "exceeded its time limit", "out_of_memory": memory}[outcome.failure]
        return RoundsFailed(outcome.failure, f"{who} {what}\n{outcome.output[-1500:]}")
    if outcome.failure == "crash" and failure is None:
        return RoundsFailed("crash", f"the candidate crashed ({outcome.signal_name or 'exit code ' + str(outcome.returncode)})"
                                     f"\n{outcome.output[-1500:]}")
    if failure is None and report.get("error"):
        return RoundsFailed("crash", f"the server failed ({report.get('stage')}): {report['error']}")
    return None


REPORT_LIMITS = {"max_str_len": 4096, "max_bin_len": 4096, "max_array_len": 256, "max_map_len": 64, "max_ext_len": 0}


def _untrusted_report(outcome: SandboxOutcome | None) -> dict:
    """The server's result channel, as untrusted msgpack: only short strings survive.

    ``readable`` is False when the report is missing, oversized, malformed or has trailing
    bytes: a candidate's server whose report cannot be read fails (one stray byte must not make
    the parser drop every guard violation). Unpacked with msgpack's size limits:
    a crafted report must not cost the trusted side memory or time.
    """
    try:
        raw = msgpack.unpackb(outcome.result, strict_map_key=True, **REPORT_LIMITS) if outcome and outcome.result else None
    except Exception:
        raw = None
    readable = isinstance(raw, dict)
    raw = raw if readable else {}
    violations = []
    for v in raw.get("violations", [])[:50] if isinstance(raw.get("violations"), list) else []:
        if isinstance(v, dict) and isinstance(v.get("guard"), str) and isinstance(v.get("reason"), str):
            violations.append({"guard": v["guard"][:40], "reason": v["reason"][:400]})
    text = lambda key: raw.get(key)[:1000] if isinstance(raw.get(key), str) else ""  # noqa: E731
    return {"violations": violations, "stage": text("stage"), "error": text("error"), "readable": readable}


def _kind_and_message(message: str, default: str) -> tuple[str, str]:
    """Split the server's "[kind] text" message; unknown kinds fall back to ``default``."""
    kind, text = default, message
    if message.startswith("[") and "]" in message:
        head, _, rest = message[1:].partition("]")
        if head in ("wrong", "crash", "import", "infra", "out_of_memory"):
            kind, text = head, rest.strip()
    if kind == "crash" and any(sign in text for sign in OOM_SIGNS):
        kind = "out_of_memory"
    return kind, text or "the round failed without a message"


def _ms(values_ns: list[int]) -> str:
    return f"{statistics.median(values_ns) / 1e6:.3f}" if values_ns else "-"


SPLIT = ("the thaw", "GO to the server's wake", "its forward", "its sync", "its sync to DONE seen")
STAGING_SPLIT = ("input writes", "output reads launched", "their sync")


def _split(split_ns: list[tuple[int, ...]], terms: tuple[str, ...] = SPLIT) -> str:
    """A round's time term by term, each term's median (GO to DONE's last four by the server's own stamps)."""
    return ", ".join(f"{what} {_ms([row[i] for row in split_ns])}" for i, what in enumerate(terms))


def _iqr(values: list[float]) -> float:
    q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
    return q3 - q1


def thread_census(server: Server) -> str:
    """The server program's threads by name, for the log: each is thawed with it every round, and a
    runnable one competes for its CPUs (Kineto's profiler, tried as the fallback detector, added three)."""
    try:
        tasks = Path(f"/proc/{server.start.program_pid()}/task")
        names = sorted((t / "comm").read_text().strip() for t in tasks.iterdir())
    except (OSError, TypeError, ValueError):
        return "unread"
    return f"{len(names)}: " + ", ".join(f"{n} x{names.count(n)}" for n in dict.fromkeys(names))


def net_timing(samples_ns: list[int], null_staging_ns: list[int], calls: int = 1) -> Timing:
    """Median and IQR of the rounds less the protocol's own cost, in ms a call (``calls`` a round).

    The cost subtracted is only what the harness itself does in a round and the server can
    neither skip nor shorten: writing the inputs and reading the outputs, as null phases measured
    them before any candidate code loaded (the same server's; in turn, every server's pooled:
    harness.shared_null). Nothing the server's process
    does is subtracted (its wake-up, its loop, the moments between its DONE and its freeze are
    every phase's own, the baselines' included): a cost measured on the server's side is one a
    candidate can skip, as it skipped the output copy that the null phase once paid.
    """
    floor = statistics.median(null_staging_ns)
    net = [max(MIN_NET_MS, (s - floor) / 1e6 / calls) for s in samples_ns]
    return Timing(median_ms=statistics.median(net), iqr_ms=_iqr(net), repetitions=len(net),
                  samples_ms=[round(x, 6) for x in net], calls=calls)


def pooled(parts: list[Timing]) -> Timing:
    """One timing of several servers' rounds, in the order they ran (env_pool/reward.drift then
    sees a difference between the servers as a drift across the rounds)."""
    net = [x for part in parts for x in part.samples_ms]
    return Timing(median_ms=statistics.median(net), iqr_ms=_iqr(net), repetitions=len(net), samples_ms=net,
                  calls=parts[0].calls)


def above_protocol_noise(timing: Timing, staging_ns: list[int]) -> bool:
    """Whether a net time can be a kernel's, not an artefact of the protocol's own noise.

    A kernel reads its inputs and writes its outputs at least once, so its time cannot be
    under a quarter of what the harness took to copy the round's inputs in and its outputs out.
    A net time is a difference: on an H100 a null phase drifting by tens of us left a 0.09 ms
    kernel's rounds at the 1 us floor and scored a 17x speedup, and put an eager GELU at 17 us.
    """
    return not staging_ns or timing.median_ms * 1e6 * timing.calls > STAGING_FLOOR * statistics.median(staging_ns)


def _as_list(out: Any) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]
