"""env_pool.pool: what the worker adds around one evaluation (retries of the environment's own failures)."""
from __future__ import annotations

import asyncio
import time

from env_pool.pool import EnvPool
from tasks.task import Task


def test_infra_failures_are_retried_with_a_growing_pause_and_counted_once(tmp_path):
    # A task without a Model fails in the trusted harness every time: the environment's fault, not the candidate's.
    broken = Task(id="broken/no_model", level=1, source="x = 1\n")
    files = {"model_new.py": "import torch\nclass ModelNew(torch.nn.Module):\n    pass\n"}
    for retries, pauses in ((2, 1.0 + 2.0), (0, 0.0)):
        pool = EnvPool({"work_dir": str(tmp_path / str(retries)), "infra_retries": retries})
        begin = time.monotonic()
        result = asyncio.run(pool.evaluate(broken, files, "verify"))
        assert result.failure == "infra" and "harness failed" in result.message, result.message
        assert (pool.stats.retried, pool.stats.infra_failures, pool.stats.evaluated) == (retries, 1, 1)
        assert time.monotonic() - begin >= pauses
