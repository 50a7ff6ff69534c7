"""Act on a hung GPU: after a run timed out or the environment failed, check the device.

A kernel that never ends is killed with its process, and the GPU normally frees itself with
the context. Not always: a kernel stuck in the driver can keep the device at 100% with no
process of ours left, and a device in a bad state makes CUDA fail in every later process.
Reporting that in health() is not enough: every evaluation queued behind it would time out
too, each costing the run's full time limit and reading as the candidate's fault. So after a
timed-out or infra-failed run on a GPU worker, with the timing lane held (nothing else runs
on the device meanwhile: a timed-out run is examined before its lane is released, so the
evaluation queued behind it never starts on a hung device), the watch checks two things:

1. NVML utilisation for ``hang_check_s``: pinned at 100% in every sample although the run's
   process tree is gone (run_sandboxed kills it before returning) means a hung device.
2. A fresh sandboxed child that initialises CUDA and runs one small computation, under
   ``hang_probe_timeout_s``: if it fails or hangs, the next candidate would too.

Either marks the worker unhealthy, for good: ``EvalContext.unhealthy`` is set, evaluations
queued for the lane and new ones fail at once as ``infra`` with the reason (the caller retries
them on another worker), and health() says so. Bringing a device back (a reset, a new
machine) is an operator's or a scheduler's decision, not this worker's.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Callable

from env_pool.evaluate import EvalContext
from env_pool.isolation.sandbox import SandboxError, SandboxLimits, run_sandboxed
from env_pool.trusted.harness import out_of_memory
from protocol.results import EvalResult

PROBE_OK = "cuda-agent-probe-ok"
PROBE = (
    "import torch\n"
    "torch.cuda.init()\n"
    "x = torch.arange(1024, dtype=torch.float32, device='cuda')\n"
    "torch.cuda.synchronize()\n"
    "assert float(x.sum()) == 523776.0, 'wrong result on the device'\n"
    f"print({PROBE_OK!r})\n"
)
SAMPLE_PERIOD_S = 0.5


@dataclass
class DeviceState:
    healthy: bool = True
    reason: str = ""  # why the worker stopped taking evaluations
    since: float | None = None  # time.time() when it was marked unhealthy
    checks: int = 0  # device checks run after suspect failures
    last_check_s: float = 0.0  # how long the last check took


def nvml_utilisation_samples(duration_s: float) -> list[int]:
    """GPU utilisation (%) of this worker's device every SAMPLE_PERIOD_S; empty without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        handle = _own_device(pynvml)
        samples = []
        deadline = time.monotonic() + duration_s
        while True:
            samples.append(int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            if time.monotonic() >= deadline or samples[-1] < 100:
                return samples  # one sample below 100% already clears the device
            time.sleep(SAMPLE_PERIOD_S)
    except Exception:
        return []
    finally:
        pynvml.nvmlShutdown()


def _own_device(pynvml):
    """The NVML handle of the first visible CUDA device (an index or a UUID in CUDA_VISIBLE_DEVICES)."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    if first.isdigit():
        return pynvml.nvmlDeviceGetHandleByIndex(int(first))
    return pynvml.nvmlDeviceGetHandleByUUID(first)


class DeviceWatch:
    """Decides, after a suspect failure, whether this worker's device can still be used."""

    def __init__(self, ctx: EvalContext, enabled: bool,
                 utilisation: Callable[[float], list[int]] = nvml_utilisation_samples):
        self.ctx = ctx
        self.enabled = enabled  # GPU workers; a CPU worker has no device to hang
        self.utilisation = utilisation
        self.state = DeviceState()

    def attach(self) -> None:
        """Have evaluate() call examine() when a timed run times out, before it releases the lane."""
        if self.enabled:
            self.ctx.after_timeout = lambda: self.examine("timed-out")

    async def after(self, result: EvalResult) -> None:
        """After an infra failure (a reference that could not start CUDA, a child that would not die), examine the device."""
        if not self.enabled or not self.state.healthy or result.failure != "infra":
            return
        async with self.ctx.lane:  # no candidate on the device while it is examined
            await self.examine("failed")

    async def examine(self, after: str) -> None:
        """Check the device (the caller holds the lane); mark the worker unhealthy when it fails."""
        if not self.state.healthy:
            return
        begin = time.monotonic()
        reason = await self._examine(after)
        self.state.checks += 1
        self.state.last_check_s = time.monotonic() - begin
        if reason:
            self.mark_unhealthy(reason)

    def mark_unhealthy(self, reason: str) -> None:
        self.state.healthy, self.state.reason, self.state.since = False, reason, time.time()
        self.ctx.unhealthy = reason

    async def _examine(self, after: str) -> str:
        limit_s = float(self.ctx.cfg.hang_check_s)
        samples = await asyncio.to_thread(self.utilisation, limit_s)
        if samples and min(samples) >= 100:
            return (f"GPU utilisation stayed at 100% for {limit_s:g} s after a {after} run, with none of its processes "
                    "left: the device is hung")
        ok, detail = await asyncio.to_thread(self._probe)
        return "" if ok else f"CUDA failed in a fresh process after a {after} run: {detail}"

    def _probe(self) -> tuple[bool, str]:
        cfg = self.ctx.cfg
        scratch = self.ctx.work_dir / "scratch" / f"probe-{uuid.uuid4().hex}"
        scratch.mkdir(parents=True)
        limit_s = float(cfg.hang_probe_timeout_s)
        try:
            outcome = run_sandboxed([sys.executable, "-c", PROBE], b"", scratch,
                                    SandboxLimits(wall_s=limit_s, memory_mb=cfg.memory_limit_mb, use_gpu=True))
        except SandboxError as err:
            return False, f"the probe could not run: {err}"
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if outcome.timed_out:
            return False, f"initialising CUDA and one small kernel took longer than {limit_s:g} s"
        if outcome.failure or PROBE_OK not in outcome.output:
            if out_of_memory(outcome.output):  # the device's memory is taken (by our own harness and servers), not broken
                return True, ""
            lines = [line for line in outcome.output.strip().splitlines() if line.strip()]
            errors = [line for line in lines if "error" in line.lower()]  # torch's advice lines come last
            return False, ((errors or lines)[0] if lines else f"the probe exited with {outcome.failure or outcome.returncode}")[:500]
        return True, ""
