"""The candidate computes only inside its round's window: frozen outside it, its outputs read where
it left them (env_pool/isolation/cgroups.py's Freezer, env_pool/trusted/readout.py, env_pool/shared/arena.py)."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from env_pool.isolation.cgroups import RunCgroups
from env_pool.pool import EnvPool
from env_pool.shared.arena import LARGE_ALIGN, Pieces
from tasks.loader import load_tasks
from tests.corpus_cases import files_of

CANARY = Path(__file__).parent / "env_corpus" / "legit" / "relu_input_watcher_thread"  # the window canary


def test_arena_pieces_are_aligned_reused_and_merged_back():
    pieces = Pieces(base=4096, size=16 << 20)
    small = pieces.take(1024)
    big = pieces.take(3 << 20)
    assert small == 0 and (4096 + big) % LARGE_ALIGN == 0  # a large piece starts on a 2 MiB boundary
    assert pieces.take(32 << 20) is None  # more than is left: the caller gets the driver's memory instead
    assert pieces.give(big) and pieces.give(small) and not pieces.give(small)
    assert pieces.free == [(0, 16 << 20)] and pieces.used == {}  # everything merged back into one piece


@pytest.fixture
def spinner():
    """A child in a fresh cgroup that counts as fast as it can (its count in a file it rewrites)."""
    groups = RunCgroups.create(memory_mb=512, max_pids=64, cpus=(), skip=())
    freezer = groups.freezer()
    if freezer is None:
        groups.remove()
        pytest.skip("no cgroup freezer here")
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"spinner-{os.getpid()}"
    child = subprocess.Popen([sys.executable, "-c", (
        "import os, sys\n"
        "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)\n"
        "n = 0\n"
        "while True:\n"
        "    n += 1\n"
        "    if n % 1000 == 0: os.pwrite(fd, str(n).encode().ljust(20), 0)\n"), str(path)])
    for procs, _ in groups.join_list():
        Path(procs).write_text(str(child.pid))
    yield freezer, lambda: int(path.read_text().strip() or 0)
    freezer.thaw()
    child.kill()
    child.wait()
    freezer.close()
    groups.remove()
    path.unlink(missing_ok=True)


def test_a_frozen_run_does_nothing_until_it_is_thawed(spinner):
    freezer, count = spinner
    time.sleep(0.3)
    assert freezer.freeze()  # returns once every thread of the run is stopped
    frozen = count()
    time.sleep(0.3)
    assert count() == frozen, "the run counted while frozen"
    freezer.thaw()
    time.sleep(0.3)
    assert count() > frozen


def test_the_candidate_never_runs_while_its_inputs_are_written(tmp_path):
    """A native watcher polls both ends of the input slot; seeing one written and not the other
    means it ran during the harness's input write, and its ReLU then answers wrong. Frozen, it cannot."""
    task = {t.id: t for t in load_tasks()[0]}["level1/17_relu"]
    files = files_of(CANARY)
    # Four tries, as the corpus's: with the default three, the 2-core VM once timed 17_relu's baselines
    # at 2.2-15 ms a round in each (an infra failure, not the freezer's)
    pool = EnvPool({"work_dir": str(tmp_path), "repetitions": 9, "warmup": 3, "run_timeout_s": 60.0, "pch_dir": "",
                    "infra_retries": 3})
    result = asyncio.run(pool.evaluate(task, files, "full"))
    assert result.failure is None, f"{result.failure}: {result.message}\n{result.run_log[-1500:]}"
    # the task's own sets, its sign-changing ones, then warm-up and timed rounds on the shifted set
    assert [c.inputs for c in result.checks] == ["own"] * 5 + ["shift", "sparse_sign"] + ["shift"] * 12
