"""A CPU server's heap is faulted in before its first phase (serve.warm_heap), so timed rounds pay no page faults.

On the 2-core VM a page fault cost about 5 us: a round whose 16 MB output grew the heap took
20-30 ms against 3 ms for one that did not, and the baselines of the ReLU task came out
implausible (an IQR over twice the median) in most evaluations.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from env_pool.trusted.server_pool import STEADY_MALLOC

ROOT = Path(__file__).resolve().parent.parent

# Rounds as a CPU server serves them (serve._serve_rounds): each round's output made while the last
# round's is still held (the harness reads it after DONE), then the last one let go; in every third
# round two 32 MB temporaries, as a task's intermediates. The faults of the rounds printed.
ROUNDS = """
import resource, sys, torch
from env_pool.candidate.serve import warm_heap
from env_pool.shared.rounds import plan_layout
x = torch.rand(1024, 4096)
if sys.argv[1] == "warm":
    warm_heap(plan_layout([x], [torch.relu(x)], "cpu"))
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
kept = None
for k in range(12):
    out = torch.relu(x)
    extra = torch.relu(torch.cat([x, x])) if k % 3 == 0 else None
    kept, extra = out, None
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
"""


def _round_faults(mode: str) -> int:
    env = {**os.environ, **STEADY_MALLOC, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", ROUNDS, mode], env=env, capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


@pytest.mark.parametrize("mode, low", [("warm", True), ("cold", False)])
def test_rounds_on_a_warmed_heap_take_no_page_faults(mode, low):
    # 16 MB is 4096 pages: the cold heap faults them in as it grows, and a 32 MB temporary the top
    # cannot hold is a fresh mapping (glibc's mmap threshold) each time; the warmed heap's top holds them all.
    faults = _round_faults(mode)
    assert (faults < 1000) == low, f"{faults} page faults in 12 rounds on a {mode} heap"
