"""`cuda-agent submit` and `cuda-agent jobs`: train, eval or synth as Ray jobs on a running cluster.

``submit`` checks the config here, so that a bad key costs no cluster time, then gives Ray's
Jobs API:
- the package folder as the job's ``working_dir`` (``job.excludes`` left out);
- the resolved config as YAML in an environment variable, and the command's options: the
  driver runs on the head node, where the submitter's files are not;
- ``RAY_JOB_STOP_SIGNAL=SIGINT`` and ``RAY_JOB_STOP_WAIT_TIME_S=job.stop_grace_s``, so that
  ``jobs stop`` interrupts the driver as Ctrl-C does: a checkpoint is saved, and submitting the
  same job again resumes it.

The config is made for a cluster: ``cluster.address=auto`` (the job's own cluster), no
local-cluster sizes, and every path the way it was meant where it was typed
(launch/job_paths.py): ``storage.root`` absolute, so the run folders are where the config says
on the driver's node, not in the job's temporary working folder. The driver's interpreter is
chosen and tried on the head before the job is submitted (launch/job_python.py). Every request
carries the cluster's token where one is found as Ray finds it (actors/ray_auth.py).
"""
from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

from omegaconf import DictConfig, OmegaConf

from configs.load import ConfigError, load_config
from launch import job_python
from launch.job_paths import Paths, resolve_paths

COMMANDS = ("train", "eval", "synth")
CONFIG_ENV = "CUDA_AGENT_JOB_CONFIG"  # the resolved config, YAML
ARGV_ENV = "CUDA_AGENT_JOB_ARGV"  # the command and its options, JSON
PACKAGE_ROOT = Path(__file__).resolve().parent.parent
LOCAL_DASHBOARD = "http://127.0.0.1:8265"
OUT_KEY = {"train": "logging.out_dir", "eval": "eval.out_dir", "synth": "synth.out_dir"}


class JobError(RuntimeError):
    """A job command that cannot be carried out; the message says why and what to do."""


def cluster_config(files: list[str], overrides: list[str]) -> DictConfig:
    """The config as the job's driver will use it: checked here, its paths resolved where they were typed
    (the current folder), set for the cluster it joins."""
    cfg = load_config(files, overrides)
    resolve_paths(cfg, job_paths(cfg))
    cfg.cluster.address = "auto"
    cfg.cluster.num_cpus = None  # they size a private local cluster; the job joins the cluster's nodes
    cfg.cluster.num_gpus = None
    return cfg


def job_paths(cfg: DictConfig) -> Paths:
    """Paths typed in the current folder, for a job that runs in a copy of this package."""
    return Paths(Path.cwd(), PACKAGE_ROOT, cfg.job.excludes)


def job_argv(command: str, policy: str | None, tasks: list[str] | None, solutions: str | None,
             out: str | None, cfg: DictConfig) -> list[str]:
    """The command's own options, as the driver's command line gets them (after the config file), their
    paths resolved as the config's are."""
    if command != "eval":
        if policy or tasks or solutions or out:
            raise JobError(f"--policy, --tasks, --solutions and --out are options of eval, not of {command}")
        return [command]
    paths, argv = job_paths(cfg), ["eval"]
    argv += ["--policy", paths.spec(policy)] if policy else []
    argv += ["--solutions", paths.read(solutions)] if solutions else []
    if out:  # a run folder: under storage.root, as eval.out_dir
        argv += ["--out", str(Path(cfg.storage.root) / out) if not Path(out).is_absolute() else out]
    return argv + (["--tasks", *(paths.read(t) for t in tasks)] if tasks else [])


def api_address(address: str | None) -> str:
    """--address, else RAY_API_SERVER_ADDRESS or RAY_ADDRESS where it is a URL, else this machine's Jobs API."""
    env = os.environ.get("RAY_API_SERVER_ADDRESS") or os.environ.get("RAY_ADDRESS", "")
    return address or (env if env.startswith("http") else LOCAL_DASHBOARD)


def client(address: str | None) -> Any:
    """A Jobs API client for ``api_address(address)``, sending the cluster's token where there is one."""
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    from actors.ray_auth import auth_failure, http_headers

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = api_address(address)
    try:
        return JobSubmissionClient(address, headers=http_headers())
    except AuthenticationError as err:
        raise JobError(auth_failure(address, err)) from err
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise JobError(f"no Ray Jobs API at {address}: {str(err).splitlines()[0]}; start the head with "
                       "`ray start --head --dashboard-host 0.0.0.0`, or give --address http://HEAD:8265") from err


def submit(command: str, items: list[str], address: str | None = None, policy: str | None = None,
           tasks: list[str] | None = None, solutions: str | None = None, out: str | None = None) -> tuple[str, str]:
    """Submit ``cuda-agent COMMAND`` with this config as a Ray job; returns (job id, its run folder)."""
    if command not in COMMANDS:
        raise JobError(f"cuda-agent submit runs one of {', '.join(COMMANDS)}, not {command!r}")
    files = [i for i in items if "=" not in i]
    cfg = cluster_config(files, [i for i in items if "=" in i])
    argv = job_argv(command, policy, tasks, solutions, out, cfg)
    run_dir = argv[argv.index("--out") + 1] if "--out" in argv else OmegaConf.select(cfg, OUT_KEY[command])
    jobs = client(address or cfg.job.address or None)
    python, chosen = job_python.choose(cfg.job.python, jobs.get_address())
    cfg.job.python = python
    env_vars = {CONFIG_ENV: OmegaConf.to_yaml(cfg), ARGV_ENV: json.dumps(argv), "RAY_JOB_STOP_SIGNAL": "SIGINT",
                "RAY_JOB_STOP_WAIT_TIME_S": str(int(cfg.job.stop_grace_s)), "RAY_USAGE_STATS_ENABLED": "0",
                **{str(k): str(v) for k, v in (cfg.job.env_vars or {}).items()}}
    runtime_env = {"working_dir": str(PACKAGE_ROOT), "excludes": list(cfg.job.excludes), "env_vars": env_vars}
    try:
        job_python.check(jobs, python, runtime_env, chosen)
    except job_python.PythonError as err:
        raise JobError(str(err)) from err
    job_id = jobs.submit_job(entrypoint=f"{shlex.quote(python)} -m launch.jobs", runtime_env=runtime_env,
                             metadata={"command": command, "run_dir": str(run_dir), "config": " ".join(items)})
    return job_id, str(run_dir)


def run_in_job() -> int:
    """The job's driver: the command, with the config the submitter resolved."""
    from launch.cli import main

    argv = json.loads(os.environ[ARGV_ENV])
    with tempfile.TemporaryDirectory(prefix="cuda-agent-job-") as folder:
        config = Path(folder) / "job.yaml"
        config.write_text(os.environ[CONFIG_ENV])
        return main([argv[0], str(config), *argv[1:]])


def list_jobs(address: str | None = None) -> list[dict[str, Any]]:
    """Every job the cluster knows, newest first: id, status, command, run folder, start and end (submit's
    checks of job.python apart)."""
    rows = []
    for job in client(address).list_jobs():
        if (job.submission_id or "").startswith(job_python.CHECK_PREFIX):  # submit's own try of job.python, not a run
            continue
        meta = job.metadata or {}
        rows.append({"id": job.submission_id or job.job_id, "status": str(getattr(job.status, "value", job.status)),
                     "command": meta.get("command", job.entrypoint), "run_dir": meta.get("run_dir", ""),
                     "config": meta.get("config", ""), "start": _when(job.start_time), "end": _when(job.end_time),
                     "message": job.message or ""})
    return sorted(rows, key=lambda r: r["start"], reverse=True)


def _when(millis: int | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(millis / 1000)) if millis else ""


def logs(job_id: str, address: str | None = None, follow: bool = False, out: Any = sys.stdout) -> str:
    """The job's driver output; with ``follow``, printed as it comes until the job ends. Returns its status."""
    jobs = client(address)
    _known(jobs, job_id)
    if not follow:
        out.write(jobs.get_job_logs(job_id))
    else:
        async def tail() -> None:
            async for lines in jobs.tail_job_logs(job_id):
                out.write(lines)
                out.flush()

        asyncio.run(tail())
    return str(getattr(jobs.get_job_status(job_id), "value", ""))


def stop(job_id: str, address: str | None = None, wait_s: float = 0.0) -> str:
    """Ask the job to stop (its driver saves a checkpoint first); with ``wait_s``, wait that long for it to end."""
    from ray.job_submission import JobStatus

    jobs = client(address)
    _known(jobs, job_id)
    jobs.stop_job(job_id)
    deadline = time.monotonic() + wait_s
    status = jobs.get_job_status(job_id)
    while not status.is_terminal() and time.monotonic() < deadline:
        time.sleep(1.0)
        status = jobs.get_job_status(job_id)
    return str(status.value if isinstance(status, JobStatus) else status)


def _known(jobs: Any, job_id: str) -> None:
    ids = {j.submission_id or j.job_id for j in jobs.list_jobs()}
    if job_id not in ids:
        raise JobError(f"no job {job_id!r} on this cluster; `cuda-agent jobs list` shows the ones there are")


def wait(job_id: str, address: str | None = None, timeout_s: float = 3600.0,
         states: Iterable[str] = ("SUCCEEDED", "FAILED", "STOPPED")) -> str:
    """Block until the job reaches one of ``states``; returns it."""
    jobs, deadline = client(address), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = str(jobs.get_job_status(job_id).value)
        if status in states:
            return status
        time.sleep(1.0)
    raise JobError(f"job {job_id} did not reach {', '.join(states)} within {timeout_s:g} s")


if __name__ == "__main__":
    try:
        sys.exit(run_in_job())
    except KeyError as err:
        raise ConfigError(f"launch.jobs runs inside a job submitted by `cuda-agent submit`: {err} is not set") from err
