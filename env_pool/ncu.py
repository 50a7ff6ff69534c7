"""Nsight Compute summary of a candidate's kernels, for the agent: where does the time go?

``ncu_summary`` compiles the candidate as an evaluation does, runs one forward call under
``ncu`` in the sandbox (the candidate's own rules: hidden verifier data, no network beyond the
namespace's loopback, which ncu uses to talk to its target; the time limit is
``env.ncu_timeout_s``), and turns ncu's CSV into a few lines per kernel launch: duration,
achieved occupancy, memory and compute (SM) throughput as % of peak, registers per thread,
shared memory per block, and a one-word verdict (memory-bound, compute-bound, latency-bound).

Only the forward call is profiled: the runner warms the model up once, then brackets one call
with cudaProfilerStart/Stop, and ncu runs with ``--profile-from-start off``. The summary is
information for the agent, never part of the reward: ncu replays each kernel several times
with locked clocks, so its durations are not comparable with the environment's timings.

Whatever goes wrong (a cpp worker, no GPU, no ncu, counters restricted to admins, the run
failing) comes back as a string starting with "unavailable:" or "ncu failed:", with the reason.
"""
from __future__ import annotations

import asyncio
import csv
import io
import os
import re
import shutil
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import msgpack

from env_pool.evaluate import EvalContext, _compile_step, write_candidate
from env_pool.isolation.sandbox import UNTRUSTED_ISOLATION, SandboxError, SandboxLimits, run_sandboxed
from protocol.results import EvalResult
from tasks.solution import SOLUTION_FILE
from tasks.task import Task

SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy")
REPORT_FILE = "ncu.csv"
PAYLOAD_FILE = "ncu_payload.msgpack"
_DURATION_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
_BYTES = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "kib": 1024, "mib": 1 << 20}


@dataclass
class KernelProfile:
    """One profiled kernel launch, from ncu's details page."""

    launch: int  # ncu's ID: launches in order
    name: str  # the kernel's (demangled) name
    block: str  # "(256, 1, 1)"
    grid: str
    duration_us: float | None = None
    memory_pct: float | None = None  # Memory Throughput, % of peak (the busiest of DRAM, L2, L1)
    dram_pct: float | None = None
    compute_pct: float | None = None  # Compute (SM) Throughput, % of peak
    achieved_occupancy_pct: float | None = None
    theoretical_occupancy_pct: float | None = None
    registers: int | None = None  # registers per thread
    shared_bytes: float | None = None  # static + dynamic shared memory per block

    @property
    def bound(self) -> str:
        mem, sm = self.memory_pct or 0.0, self.compute_pct or 0.0
        if max(mem, sm) < 40:
            return "latency-bound: neither memory nor compute is busy (too few threads, low occupancy, or waiting)"
        if mem >= sm:
            return "memory-bound" + (": near peak bandwidth, move fewer bytes" if mem >= 80 else "")
        return "compute-bound" + (": near peak, do less work per element" if sm >= 80 else "")


def parse_ncu_csv(text: str) -> list[KernelProfile]:
    """Kernel launches from ``ncu --csv --page details`` output (preamble and app output tolerated)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"') and '"Metric Name"' in line), None)
    if start is None:
        return []
    rows = csv.DictReader(io.StringIO("\n".join(line for line in lines[start:] if line.startswith('"'))))
    kernels: dict[str, KernelProfile] = {}
    for row in rows:
        if not row.get("ID") or not row["ID"].isdigit() or row.get("Metric Name") is None:
            continue  # a repeated header or a stray line
        k = kernels.get(row["ID"])
        if k is None:
            k = kernels[row["ID"]] = KernelProfile(int(row["ID"]), row.get("Kernel Name", "?"), row.get("Block Size", ""),
                                                   row.get("Grid Size", ""))
        _apply(k, row["Metric Name"], (row.get("Metric Unit") or "").strip(), _number(row.get("Metric Value")))
    return sorted(kernels.values(), key=lambda k: k.launch)


def _number(value: str | None) -> float | None:
    try:
        return float((value or "").replace(",", ""))  # ncu prints thousands separators: "1,048,576"
    except ValueError:
        return None  # "n/a", a name ("CachePreferNone"), empty


def _apply(k: KernelProfile, metric: str, unit: str, value: float | None) -> None:
    if value is None:
        return
    if metric == "Duration":
        k.duration_us = value * _DURATION_US.get(unit.lower(), 1.0)
    elif metric == "Memory Throughput" and unit == "%":
        k.memory_pct = value
    elif metric == "DRAM Throughput" and unit == "%":
        k.dram_pct = value
    elif metric == "Compute (SM) Throughput":
        k.compute_pct = value
    elif metric == "Achieved Occupancy":
        k.achieved_occupancy_pct = value
    elif metric == "Theoretical Occupancy":
        k.theoretical_occupancy_pct = value
    elif metric == "Registers Per Thread":
        k.registers = int(value)
    elif metric in ("Static Shared Memory Per Block", "Dynamic Shared Memory Per Block"):
        scale = _BYTES.get(unit.lower().split("/")[0], 1)
        k.shared_bytes = (k.shared_bytes or 0.0) + value * scale


def summarize(kernels: list[KernelProfile], max_kernels: int) -> str:
    """A short table for the agent, one line per launch, then the verdicts."""
    if not kernels:
        return "ncu profiled no kernel in the forward call: did ModelNew launch any CUDA kernel?"
    total = sum(k.duration_us or 0.0 for k in kernels)
    out = [f"ncu: {len(kernels)} kernel launch(es) in one forward call, {total:.1f} us in total "
           "(ncu replays with locked clocks: compare kernels with each other, not with the timings)",
           f"{'#':>2}  {'kernel':<40} {'time':>10} {'occup.':>7} {'memory':>7} {'compute':>8} {'regs':>5} {'smem/blk':>9}  block x grid"]
    for i, k in enumerate(kernels[:max_kernels]):
        out.append(f"{i:>2}  {_short(k.name):<40} {_fmt(k.duration_us, ' us', 1):>10} {_fmt(k.achieved_occupancy_pct, '%', 0):>7} "
                   f"{_fmt(k.memory_pct, '%', 0):>7} {_fmt(k.compute_pct, '%', 0):>8} {_fmt(k.registers, '', 0):>5} "
                   f"{_bytes(k.shared_bytes):>9}  {k.block} x {k.grid}")
    if len(kernels) > max_kernels:
        out.append(f"... {len(kernels) - max_kernels} more launches not shown")
    out.append("")
    for i, k in enumerate(kernels[:max_kernels]):
        share = f"{100 * (k.duration_us or 0) / total:.0f}% of the time, " if total else ""
        note = f"{i}: {share}{k.bound}"
        if k.theoretical_occupancy_pct is not None and k.theoretical_occupancy_pct < 50:
            note += f"; theoretical occupancy only {k.theoretical_occupancy_pct:.0f}% (registers, shared memory or block size)"
        out.append(note)
    return "\n".join(out)


def _short(name: str) -> str:
    name = re.sub(r"^void ", "", name)
    depth, cut = 0, len(name)
    for i, c in enumerate(name):  # drop the argument list, keep template arguments
        depth += c == "<"
        depth -= c == ">"
        if c == "(" and depth == 0:
            cut = i
            break
    name = name[:cut]
    return name if len(name) <= 40 else name[:37] + "..."


def _fmt(value: float | None, unit: str, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def _bytes(n: float | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n:.0f} B"


# ---- Running ncu ------------------------------------------------------------------------------


def find_ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and os.access(os.path.join(home, "bin", "ncu"), os.X_OK):
            return os.path.join(home, "bin", "ncu")
    return None


def counters_admin_only() -> bool:
    """True where the driver lets only admins read GPU performance counters (NVreg_RestrictProfilingToAdminUsers=1)."""
    try:
        text = Path("/proc/driver/nvidia/params").read_text()
    except OSError:
        return False
    m = re.search(r"^RmProfilingAdminOnly:\s*(\d+)", text, re.M)
    return bool(m and m.group(1) != "0")


def unavailable_reason(ctx: EvalContext) -> str:
    """Why ncu cannot run on this worker, or "" when it can."""
    backend = str(ctx.cfg.backend)
    if backend != "cuda":
        return f"unavailable: ncu profiles CUDA kernels, and this worker's backend is {backend}"
    if not any(n.startswith("nvidia") and n[6:].isdigit() for n in _dev_names()):
        return "unavailable: no NVIDIA GPU on this machine"
    if find_ncu() is None:
        return "unavailable: ncu (Nsight Compute) is not installed here (not on PATH, nor in CUDA_HOME/bin)"
    if counters_admin_only() and not ctx.cfg.ncu_admin:
        return ("unavailable: the driver restricts GPU performance counters to admins (RmProfilingAdminOnly=1) and "
                "candidates run without capabilities; set NVreg_RestrictProfilingToAdminUsers=0 in the driver, or "
                "env.ncu_admin=true (trusted candidates only: it weakens the sandbox)")
    return ""


def _dev_names() -> list[str]:
    try:
        return os.listdir("/dev")
    except OSError:
        return []


def ncu_command(ncu: str, max_kernels: int) -> list[str]:
    return [ncu, "--csv", "--page", "details", "--profile-from-start", "off", "--launch-count", str(max_kernels),
            "--target-processes", "all", "--log-file", REPORT_FILE,
            *[arg for section in SECTIONS for arg in ("--section", section)],
            sys.executable, "-m", "env_pool.candidate.runner", "--payload", PAYLOAD_FILE]


async def ncu_summary(ctx: EvalContext, task: Task, files: Mapping[str, str]) -> str:
    """Profile one forward call of the candidate with ncu and summarise it; never raises for the candidate's faults."""
    reason = unavailable_reason(ctx)
    if reason:
        return reason
    if SOLUTION_FILE not in files:
        return f"ncu failed: {SOLUTION_FILE} is missing"
    scratch = ctx.work_dir / "scratch" / f"ncu-{uuid.uuid4().hex}"
    try:
        scratch.mkdir(parents=True)
        write_candidate(scratch, files)
        built = EvalResult(task_id=task.id, backend="cuda")
        if not await _compile_step(ctx, dict(files), "cuda", scratch, built):
            return f"ncu failed: the candidate does not compile: {built.message}"
        payload = {"role": "ncu", "backend": "cuda", "task": task.to_dict(), "threads": ctx.cfg.threads,
                   "init_seed": int.from_bytes(os.urandom(6), "little")}
        (scratch / PAYLOAD_FILE).write_bytes(msgpack.packb(payload))
        async with ctx.timing_lane():  # ncu replays kernels with locked clocks: nothing else may run on the device
            return await _run(ctx, scratch)
    except (SandboxError, OSError) as err:
        return f"ncu failed: the environment failed: {type(err).__name__}: {err}"
    except Exception as err:  # noqa: BLE001 - WorkerUnhealthy and the like: a summary is informational
        return f"ncu failed: {type(err).__name__}: {err}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _env(ctx: EvalContext, scratch: Path) -> dict[str, str]:
    # As evaluate._child gives the candidate: the load_inline build of the compile step is found again.
    return {"OMP_NUM_THREADS": str(ctx.cfg.threads), "TORCH_EXTENSIONS_DIR": str(scratch / ".torch_extensions"),
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


async def _run(ctx: EvalContext, scratch: Path) -> str:
    cfg = ctx.cfg
    admin = counters_admin_only() and bool(cfg.ncu_admin)
    limits = SandboxLimits(wall_s=float(cfg.ncu_timeout_s), memory_mb=cfg.memory_limit_mb, use_gpu=True, loopback=True,
                           hidden_paths=ctx.private_paths,
                           keep_capabilities=("CAP_SYS_ADMIN",) if admin else (),
                           required_isolation=tuple(r for r in UNTRUSTED_ISOLATION if not (admin and r == "no-caps")))
    outcome = await asyncio.to_thread(run_sandboxed, ncu_command(find_ncu(), int(cfg.ncu_max_kernels)), b"", scratch,
                                      limits, _env(ctx, scratch))
    report = scratch / REPORT_FILE
    text = report.read_text(errors="replace") if report.exists() else ""
    kernels = parse_ncu_csv(text) or parse_ncu_csv(outcome.output)
    if outcome.timed_out:
        return f"ncu failed: profiling took longer than the {cfg.ncu_timeout_s:g} s limit (env.ncu_timeout_s)"
    if not kernels and (outcome.failure or outcome.returncode):
        tail = "\n".join((text + "\n" + outcome.output).strip().splitlines()[-15:])
        return f"ncu failed ({outcome.failure or 'exit code ' + str(outcome.returncode)}):\n{tail}"
    return summarize(kernels, int(cfg.ncu_max_kernels))
