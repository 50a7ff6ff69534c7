"""env_pool.device_watch: after a timed-out run, a GPU that no longer works takes its worker out of service.

This machine has no GPU, which is exactly the state of a broken one as far as the probe can
tell: a fresh sandboxed child that initialises CUDA fails. The watch is switched on for a
cpp worker here (it is on for cuda workers only by default), so the whole chain runs for
real: a candidate that never ends, the kill at the time limit, the probe, the verdict, and the
evaluation that was queued behind the hang.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from env_pool.device_watch import DeviceWatch
from env_pool.pool import EnvPool
from tasks.loader import load_tasks

CORPUS = Path(__file__).parent / "env_corpus"


def files_of(name: str) -> dict[str, str]:
    return {p.name: p.read_text() for p in (CORPUS / name).iterdir() if p.name != "case.json"}


@pytest.fixture(scope="module")
def gelu():
    return {t.id: t for t in load_tasks()[0]}["level1/01_gelu"]


def watched_pool(tmp_path: Path, utilisation=None) -> EnvPool:
    pool = EnvPool({"work_dir": str(tmp_path), "run_timeout_s": 20.0, "hang_check_s": 1.0, "hang_probe_timeout_s": 60.0})
    kwargs = {"utilisation": utilisation} if utilisation else {}
    pool.watch = DeviceWatch(pool.ctx, enabled=True, **kwargs)
    pool.watch.attach()
    return pool


def test_timeout_on_a_broken_device_fails_the_queued_evaluation_as_infra(tmp_path, gelu):
    pool = watched_pool(tmp_path)

    async def scenario():
        hang = asyncio.create_task(pool.evaluate(gelu, files_of("hacks/infinite_loop_python"), "verify"))
        while not pool.ctx.lane.locked():  # the hanging candidate holds the device
            await asyncio.sleep(0.05)
        queued = asyncio.create_task(pool.evaluate(gelu, files_of("legit/gelu_omp"), "verify"))
        return await hang, await queued

    hung, queued = asyncio.run(scenario())
    assert hung.failure == "timeout", hung.message
    assert queued.failure == "infra" and queued.reward == -1.0, f"the queued evaluation ran: {queued.failure}: {queued.message}"
    assert "unhealthy" in queued.message and "retry" in queued.message and "CUDA failed in a fresh process" in queued.message

    health = pool.health()
    assert health["healthy"] is False and health["device_checks"] == 1
    assert "after a timed-out run" in health["unhealthy_reason"], health["unhealthy_reason"]

    begin = time.monotonic()  # later evaluations are refused at once, without compiling or running anything
    later = asyncio.run(pool.evaluate(gelu, files_of("legit/gelu_omp"), "verify"))
    assert later.failure == "infra" and time.monotonic() - begin < 1.0
    assert pool.stats.retried == 0, "an unhealthy worker must not retry: the caller retries elsewhere"


def test_utilisation_pinned_at_100_percent_marks_the_device_hung_without_a_probe(tmp_path):
    pool = watched_pool(tmp_path, utilisation=lambda seconds: [100] * 3)
    asyncio.run(pool.watch.examine("timed-out"))
    assert not pool.health()["healthy"]
    assert "stayed at 100%" in pool.health()["unhealthy_reason"] and pool.ctx.unhealthy


def test_gpu_workers_are_watched_and_cpu_workers_are_not(tmp_path):
    pool = EnvPool({"work_dir": str(tmp_path), "backend": "cuda"})
    assert pool.watch.enabled and pool.health()["healthy"] is True
    cpu_pool = EnvPool({"work_dir": str(tmp_path)})
    assert not cpu_pool.watch.enabled and cpu_pool.ctx.after_timeout is None


def probe_printing(*lines: str) -> str:
    return "import sys\n" + "".join(f"print({line!r})\n" for line in lines) + "sys.exit(1)\n"


def test_a_probe_out_of_memory_leaves_the_worker_in_service_and_a_real_failure_is_named(tmp_path, monkeypatch):
    """Memory held by the worker's own harness and servers is not a broken device (the H100 sweep lost a worker to it)."""
    from env_pool import device_watch

    pool = watched_pool(tmp_path, utilisation=lambda seconds: [0] * 3)
    advice = "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."
    monkeypatch.setattr(device_watch, "PROBE", probe_printing("torch.OutOfMemoryError: CUDA error: out of memory", advice))
    asyncio.run(pool.watch.examine("failed"))
    assert pool.health()["healthy"] is True and not pool.ctx.unhealthy
    monkeypatch.setattr(device_watch, "PROBE", probe_printing("RuntimeError: CUDA error: an illegal memory access was encountered", advice))
    asyncio.run(pool.watch.examine("failed"))
    reason = pool.health()["unhealthy_reason"]
    assert pool.health()["healthy"] is False and "illegal memory access" in reason, reason
