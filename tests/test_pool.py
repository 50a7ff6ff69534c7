"""env_pool.pool: what the worker adds around one evaluation (retries of the environment's own failures)."""
from __future__ import annotations

import pytest

import asyncio
import time
from typing import Any

from env_pool.evaluate import Baseline
from env_pool.pool import EnvPool
from protocol.results import Timing
from tasks.task import Task


def test_infra_failures_are_retried_with_a_growing_pause_and_counted_once(tmp_path, caplog):
    # A task without a Model fails in the trusted harness every time: the environment's fault, not the candidate's.
    caplog.set_level("INFO", logger="cuda_agent.env")
    broken = Task(id="broken/no_model", level=1, source="x = 1\n")
    files = {"model_new.py": "import torch\nclass ModelNew(torch.nn.Module):\n    pass\n"}
    for retries, pauses in ((2, 1.0 + 2.0), (0, 0.0)):
        pool = EnvPool({"work_dir": str(tmp_path / str(retries)), "infra_retries": retries})
        begin = time.monotonic()
        result = asyncio.run(pool.evaluate(broken, files, "verify"))
        assert result.failure == "infra" and "harness failed" in result.message, result.message
        assert (pool.stats.retried, pool.stats.infra_failures, pool.stats.evaluated) == (retries, 1, 1)
        assert time.monotonic() - begin >= pauses
    # each try is a line of the harness's log, and each retry a line of the worker's, with its reason
    tries = [line for line in (tmp_path / "2" / "harness.log").read_text().splitlines() if "broken/no_model verify:" in line]
    assert len([t for t in tries if ": begun" in t]) == 3 and len([t for t in tries if ": infra in " in t]) == 3, tries
    retried = [r.getMessage() for r in caplog.records if r.name == "cuda_agent.env"]
    assert len(retried) == 2 and all("the environment failed (the harness failed" in m for m in retried), retried


TOO_FAST = '''"""The first element of a large vector: the reference takes microseconds, the harness's copy of its input milliseconds."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x[:1].clone()


def get_inputs():
    return [torch.randn(4_000_000)]


def get_init_inputs():
    return []
'''

FIRST_KERNEL = {
    "kernel.cpp": 'extern "C" void first(const float* x, float* y) { y[0] = x[0]; }\n',
    "model_new.py": (
        "import ctypes, os\nimport torch\nimport torch.nn as nn\n\n"
        "_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'kernel.so'))\n"
        "_lib.first.argtypes = [ctypes.c_void_p, ctypes.c_void_p]\n\n\n"
        "class ModelNew(nn.Module):\n"
        "    def forward(self, x):\n"
        "        y = torch.empty(1)\n"
        "        _lib.first(x.data_ptr(), y.data_ptr())\n"
        "        return y\n"),
}


@pytest.mark.slow  # 111 s on 2 cores: three torch.compile baselines in vain
def test_a_task_too_fast_to_time_is_verified_only_after_three_baselines_in_vain(tmp_path):
    task = Task(id="tiny/first_element", level=1, source=TOO_FAST)
    pool = EnvPool({"work_dir": str(tmp_path), "infra_retries": 2, "repetitions": 5, "warmup": 1})
    first = asyncio.run(pool.evaluate(task, FIRST_KERNEL, "full"))
    assert first.failure is None and int(first.milestone) == 1, f"{first.failure}: {first.message}"
    assert first.message.startswith("speed not judged") and "within the timing protocol's own noise" in first.message
    assert first.candidate is None and pool.stats.retried == 2, "two retries measured the baselines again, then no more"
    again = asyncio.run(pool.evaluate(task, FIRST_KERNEL, "full"))
    assert (again.failure, int(again.milestone), pool.stats.retried) == (None, 1, 2), again.message
    assert again.message.startswith("speed not judged") and ("tiny/first_element", "cpp") not in pool.ctx.baselines


SLOW_FIRST_KERNEL = {
    **FIRST_KERNEL,
    # the first element after ~100 ms of spinning: well above the protocol's noise on a 128 MB input
    "kernel.cpp": 'extern "C" void first(const float* x, float* y) {\n'
                  '  for (volatile long i = 0; i < 100000000; ++i) {}\n  y[0] = x[0];\n}\n',
}
# Its copy of a 128 MB input takes the harness tens of milliseconds a round: the reference's
# microseconds are within its noise every time.
FAR_TOO_FAST = TOO_FAST.replace("torch.randn(4_000_000)", "torch.randn(32_000_000)")


def test_an_untimeable_eager_recheck_withholds_speed_instead_of_failing_the_evaluation(tmp_path):
    """The eager recheck of a task whose reference is within the protocol's noise cannot say how far
    the machine moved: the candidate is correct with no speed claim, in one run. It was an infra
    failure, the whole evaluation retried until the task was struck off as untimeable."""
    task = Task(id="tiny/first_of_many", level=1, source=FAR_TOO_FAST)
    pool = EnvPool({"work_dir": str(tmp_path), "repetitions": 5, "warmup": 1, "eager_recheck": True, "pch_dir": ""})
    cached = Timing(median_ms=500.0, iqr_ms=1.0, repetitions=5, samples_ms=[499.0, 499.5, 500.0, 500.5, 501.0])
    pool.ctx.baselines[(task.id, "cpp")] = Baseline(eager=cached, compiled=cached)  # timed in a stretch long gone
    result = asyncio.run(pool.evaluate(task, SLOW_FIRST_KERNEL, "full"))
    assert result.failure is None and int(result.milestone) == 1, f"{result.failure}: {result.message}"
    assert result.candidate is None and result.eager_recheck is None and pool.stats.retried == 0
    assert "speed not judged" in result.message and "timed again right after your rounds" in result.message, result.message


def test_compiles_beyond_env_compile_workers_wait_for_a_slot(tmp_path):
    # Each g++ or nvcc of torch's headers holds 1-2 GB: a worker runs env.compile_workers at once.
    assert EnvPool({"work_dir": str(tmp_path), "compile_workers": 3}).ctx.compile_slots._value == 3
    task = Task(id="tiny/first_element", level=1, source=TOO_FAST)

    async def compile_while_the_only_slot_is_held() -> tuple[bool, Any]:
        pool = EnvPool({"work_dir": str(tmp_path), "compile_workers": 1})
        first = await pool.evaluate(task, FIRST_KERNEL, "compile")  # built once: the next is a cache hit (milliseconds)
        assert first.failure is None, f"{first.failure}: {first.message}"
        async with pool.ctx.compile_slots:  # another candidate's compile holds the worker's only slot
            waiting = asyncio.ensure_future(pool.evaluate(task, FIRST_KERNEL, "compile"))
            await asyncio.sleep(2.0)
            compiled_meanwhile = waiting.done()
        return compiled_meanwhile, await waiting

    compiled_meanwhile, result = asyncio.run(compile_while_the_only_slot_is_held())
    assert not compiled_meanwhile, "the compile ran although env.compile_workers=1 and the slot was taken"
    assert result.failure is None and result.cache_hit, f"{result.failure}: {result.message}"


TRANSPOSED = '''"""Twice a matrix, returned transposed: a strided view, as level1/97_ScaledDotProductAttention's reference returns."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return (x * 2).t()


def get_inputs():
    return [torch.randn(64, 48)]


def get_init_inputs():
    return []
'''


def doubled(ret: str) -> dict[str, str]:
    """A ctypes kernel that doubles x into y (x's shape); forward returns ``ret`` of y."""
    return {
        "kernel.cpp": 'extern "C" void twice(const float* x, float* y, long n) { for (long i = 0; i < n; ++i) y[i] = 2 * x[i]; }\n',
        "model_new.py": (
            "import ctypes, os\nimport torch\nimport torch.nn as nn\n\n"
            "_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'kernel.so'))\n"
            "_lib.twice.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]\n\n\n"
            "class ModelNew(nn.Module):\n"
            "    def forward(self, x):\n"
            "        y = torch.empty_like(x)\n"
            "        _lib.twice(x.data_ptr(), y.data_ptr(), x.numel())\n"
            f"        return {ret}\n"),
    }


def test_an_output_may_be_strided_where_the_reference_returns_it_strided_and_nowhere_else(tmp_path):
    pool = EnvPool({"work_dir": str(tmp_path), "repetitions": 5, "warmup": 1})
    strided = Task(id="tiny/transposed", level=1, source=TRANSPOSED)
    for ret in ("y.t()", "y.t().clone(memory_format=torch.contiguous_format)"):  # as the reference, or contiguous
        got = asyncio.run(pool.evaluate(strided, doubled(ret), "verify"))
        assert got.failure is None and int(got.milestone) >= 1, f"{ret}: {got.failure}: {got.message}"
    square = Task(id="tiny/doubled", level=1, source=TRANSPOSED.replace("(x * 2).t()", "x * 2").replace("64, 48", "48, 48"))
    # the right values in a strided view (transposed twice): the reference returns them contiguous
    got = asyncio.run(pool.evaluate(square, doubled("y.t().contiguous().t()"), "verify"))
    assert got.failure == "wrong" and "not contiguous" in got.message, f"{got.failure}: {got.message}"
