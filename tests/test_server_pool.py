"""env_pool.trusted.server_pool: candidates' servers started ahead of need, each used for one candidate only.

Real evaluations on the cpp backend: a worker with warm servers gives its second evaluation a
server that was started before it was asked for, and nothing the first candidate left behind
(files, environment, patched modules, threads) is there for the second.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from env_pool.pool import EnvPool
from tasks.loader import load_tasks
from tests.corpus_cases import files_of

CORPUS = Path(__file__).parent / "env_corpus"

LEAVE = '''
import os, threading, time
import torch
os.environ["LEFT_BY_FIRST"] = "1"
torch.left_by_first = True
threading.Thread(target=time.sleep, args=(3600,), name="left_by_first", daemon=True).start()
for path in ("left_by_first", "/tmp/left_by_first"):
    try:  # refused (the seccomp filter: no file opened for writing); were it not, the next server must not see it
        open(path, "w").write("x")
    except OSError:
        pass
'''

FIND = '''
import os, threading
import torch
_found = [what for what, there in (
    ("environment", "LEFT_BY_FIRST" in os.environ), ("module", hasattr(torch, "left_by_first")),
    ("tmp", os.path.exists("/tmp/left_by_first")), ("cwd", os.path.exists("left_by_first")),
    ("thread", any(t.name == "left_by_first" for t in threading.enumerate()))) if there]
if _found:
    raise RuntimeError(f"found what the first candidate left: {_found}")
'''


@pytest.fixture(scope="module")
def gelu():
    return {t.id: t for t in load_tasks()[0]}["level1/01_gelu"]


def with_prelude(prelude: str) -> dict[str, str]:
    files = files_of(CORPUS / "legit" / "gelu_omp")
    files["model_new.py"] = prelude + files["model_new.py"]
    return files


def test_each_server_serves_one_candidate_and_the_next_one_was_started_ahead(tmp_path, gelu):
    pool = EnvPool({"work_dir": str(tmp_path), "warm_servers": 1})
    first = asyncio.run(pool.evaluate(gelu, with_prelude(LEAVE), "verify"))
    assert first.failure in (None, "guard"), f"{first.failure}: {first.message}\n{first.run_log[-2000:]}"
    second = asyncio.run(pool.evaluate(gelu, with_prelude(FIND), "verify"))
    assert second.failure is None, f"{second.failure}: {second.message}\n{second.run_log[-2000:]}"
    assert not first.warm_server and second.warm_server, "the first server starts on demand, the second waited warm"
    scratch = tmp_path / "scratch"
    assert len(list(scratch.glob("server-*"))) == 1, "only the waiting server's folder is left"


def test_without_warm_servers_every_evaluation_starts_its_own(tmp_path, gelu):
    pool = EnvPool({"work_dir": str(tmp_path), "warm_servers": 0})
    results = [asyncio.run(pool.evaluate(gelu, files_of(CORPUS / "legit" / "gelu_omp"), "verify")) for _ in range(2)]
    assert [(r.failure, r.warm_server) for r in results] == [(None, False), (None, False)], [r.message for r in results]
    assert not list((tmp_path / "scratch").glob("server-*")), "no server waits, no folder is left"


@pytest.mark.parametrize("is_contended", [True, False])
def test_a_contended_harness_refills_after_the_run_not_as_a_server_is_taken(tmp_path, monkeypatch, is_contended):
    """On a harness with few CPUs a start-up begun as timed rounds begin disturbs its clock: none starts in take()."""
    from env_pool.trusted import server_pool

    monkeypatch.setattr(server_pool, "contended", lambda: is_contended)
    spec = server_pool.ServerSpec(device="cpu", threads=1, wall_s=30.0, memory_mb=2048, hidden=(), required=(), cpus=(), startup_cpus=(),
                                  trusted=False, inductor_dir="", root=str(tmp_path))
    pool = server_pool.ServerPool()
    try:
        taken = pool.take(spec, keep=2)
        assert len(pool.waiting) == (0 if is_contended else 2)
        pool.refill(2)
        assert len(pool.waiting) == 2 and all(s.spec == spec for s in pool.waiting)
        taken.finish()
    finally:
        pool.close()
    assert not list(tmp_path.glob("server-*")), "every server's folder goes with it"


@pytest.mark.parametrize("device, is_contended, shielded", [("cuda", False, True), ("cpu", False, False), ("cpu", True, True)])
def test_timed_rounds_on_a_gpu_are_shielded_from_start_ups_whatever_the_cpus(monkeypatch, device, is_contended, shielded):
    """A start-up's CUDA context and first kernels share the device with a timed run (H100: baselines 2-4x slow)."""
    from env_pool.trusted import server_pool

    monkeypatch.setattr(server_pool, "contended", lambda: is_contended)
    pool = server_pool.ServerPool()
    pool.spec = server_pool.ServerSpec(device=device, threads=1, wall_s=30.0, memory_mb=2048, hidden=(), required=(),
                                       cpus=(), startup_cpus=(), trusted=False, inductor_dir="", root="/nonexistent")
    assert pool.shielded() is shielded


def test_a_server_takes_copies_so_a_retry_of_the_request_finds_the_files(tmp_path):
    """The harness retries a request in a fresh server after running out of device memory: the
    first server must leave the candidate's files where the second takes them, sealed as before
    (on the H100, moved files made a correct kernel on a 6 GiB problem a compile error)."""
    from types import SimpleNamespace

    from env_pool.evaluate import seal
    from env_pool.trusted.server_pool import Server

    scratch = tmp_path / "scratch"
    (scratch / "build").mkdir(parents=True)
    (scratch / "model_new.py").write_text("class ModelNew: pass\n")
    (scratch / "build" / "ext.so").write_bytes(b"\x7fELF")
    (scratch / "build" / "outside").symlink_to("/etc/hostname")
    (scratch / "kernel.so").write_bytes(b"\x7fELF")
    seal(scratch / "kernel.so")
    (scratch / "tmp").mkdir()
    sealed = (scratch / "kernel.so").stat()
    for name in ("first", "retry"):
        cwd = tmp_path / name
        (cwd / "build").mkdir(parents=True)  # a folder of the same name from the server's start-up
        Server.take_files(SimpleNamespace(cwd=cwd), scratch)
        assert (cwd / "model_new.py").read_text() == "class ModelNew: pass\n", name
        assert (cwd / "build" / "ext.so").exists() and (cwd / "build" / "outside").is_symlink(), name
        kernel = (cwd / "kernel.so").stat()
        assert (kernel.st_mode & 0o777, kernel.st_uid) == (sealed.st_mode & 0o777, sealed.st_uid), name
        assert not (cwd / "tmp").exists(), name


def _spec(tmp_path, device: str = "cpu"):
    from env_pool.trusted import server_pool

    return server_pool.ServerSpec(device=device, threads=1, wall_s=30.0, memory_mb=2048, hidden=(), required=(), cpus=(),
                                  startup_cpus=(), trusted=False, inductor_dir="", root=str(tmp_path))


def test_the_pool_hands_out_a_server_whose_start_up_is_done_before_an_older_one_still_starting(tmp_path, monkeypatch):
    """A taken server still starting makes its evaluation wait for the start-up; one that said it is done goes first."""
    import time

    from env_pool.trusted import server_pool

    monkeypatch.setattr(server_pool, "contended", lambda: True)  # no refill in take(): the pool holds only these two
    spec = _spec(tmp_path)
    pool = server_pool.ServerPool()
    pool.spec = spec
    done = server_pool.Server(spec)
    try:
        deadline = time.monotonic() + 120
        while not done.started and time.monotonic() < deadline:
            time.sleep(0.1)
        assert done.started, "a server says when its start-up is done"
        starting = server_pool.Server(spec)
        assert not starting.started, "a server that just began its start-up has not said so"
        pool.waiting = [starting, done]  # the older one first, as refill() leaves them
        taken = pool.take(spec, keep=0)
        assert taken is done and taken.warm and pool.waiting == [starting]
        taken.finish()
    finally:
        pool.close()
        done.finish()


def test_a_full_evaluation_pauses_the_waiting_servers_for_its_rounds_only(tmp_path, gelu, monkeypatch):
    """The pause covers the rounds, not the wait for a phase: paused through that too, start-ups progressed
    only between evaluations, and each warm full evaluation on the H100 waited ~12 s for the server it took."""
    from configs.schema import EnvConfig
    from env_pool.evaluate import Baseline, EvalContext, evaluate
    from env_pool.trusted import round_protocol, server_pool
    from protocol.results import Timing
    from scripts.profile_harness import InProcessHarness

    monkeypatch.setattr(server_pool, "contended", lambda: True)  # shielded, as on a GPU or 2 cores
    # Cached baselines (env.baseline_timing): the known ones below keep the full evaluation to the candidate's phases.
    ctx = EvalContext(cfg=EnvConfig(work_dir=str(tmp_path), warm_servers=2, baseline_timing="cached", repetitions=30))
    ctx._harness = inproc = InProcessHarness()
    seen: dict[str, list[bool]] = {"wait": [], "rounds": []}

    def stopped() -> list[bool]:  # per waiting server: is any of its processes stopped?
        return [any(_state(pid) == "T" for pid in s.pids()) for s in inproc.pools.candidates.waiting if s.pids()]

    def spy(name, original):
        def wrapped(*args, **kwargs):
            seen[name].extend(stopped())
            return original(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(round_protocol, "wait_ready", spy("wait", round_protocol.wait_ready))
    monkeypatch.setattr(round_protocol.Rounds, "write_inputs", spy("rounds", round_protocol.Rounds.write_inputs))
    files = files_of(CORPUS / "legit" / "gelu_omp")
    try:
        first = asyncio.run(evaluate(ctx, gelu, files, "verify"))  # starts the pool (refilled after its run)
        # The baselines are not what this is about: known ones keep the full evaluation to the candidate's phases.
        ctx.baselines[(gelu.id, "cpp")] = Baseline(Timing(5.0, 0.1, 30), Timing(4.0, 0.1, 30))
        second = asyncio.run(evaluate(ctx, gelu, files, "full"))
    finally:
        inproc.close()
    assert (first.failure, second.failure) == (None, None), (first.message, second.message)
    rounds, waits = seen["rounds"], seen["wait"]
    assert True in rounds and all(rounds[-2:]), f"the full evaluation's rounds ran with start-ups paused ({sum(rounds)}/{len(rounds)})"
    assert waits and not any(waits), f"no start-up was paused while a phase was awaited ({sum(waits)}/{len(waits)})"


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0]
    except OSError:
        return ""
