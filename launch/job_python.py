"""The interpreter that runs a job's driver on the head, chosen and tried before the job is submitted.

A Ray job's entrypoint runs in a shell of the head's Ray processes, so a bare ``python`` is the
one on the PATH of whoever ran ``ray start``: often not the project's environment, and the job
then dies in its first second on an import. So ``job.python`` is, unless set:

- the interpreter running ``cuda-agent submit`` when the head is this machine (it imports the
  project: it is running it);
- else ``python``, which the head's environment must make the project's.

Whichever it is, ``check`` runs ``CHECK`` with it as a short job in the same runtime environment
as the real one (the package as working_dir, the same variables) and, where that fails, names the
interpreter, what it said, and the fix: the job never starts with a Python that cannot run it.
"""
from __future__ import annotations

import ipaddress
import shlex
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

# What every command's driver imports first: the package, its config library, Ray and torch.
CHECK = "import launch.jobs, omegaconf, ray, torch"
CHECK_PREFIX = "cuda-agent-python-check-"  # the check's job id, then a random tail
CHECK_TIMEOUT_S = 180.0  # a busy head takes seconds to start the job and import torch; this is its limit


class PythonError(RuntimeError):
    """job.python cannot run the job's driver on the head; the message says why and how to fix it."""


def choose(configured: str, api_address: str) -> tuple[str, str]:
    """The interpreter and where it came from: job.python, else this one where the head is this machine,
    else ``python``."""
    if configured:
        # A path typed relative to here means here (the head is this machine, or shares the path).
        relative = "/" in configured and not configured.startswith("~") and not Path(configured).is_absolute()
        return (str(Path(configured).absolute()) if relative else configured), "job.python"
    if head_is_here(api_address):
        return sys.executable, "the interpreter running `cuda-agent submit`: the head is this machine"
    return "python", "job.python unset: `python` on the PATH of `ray start` on the head"


def head_is_here(api_address: str) -> bool:
    """Whether the Jobs API's host is this machine: a loopback address, or one of its own interfaces'."""
    host = urlparse(api_address if "://" in api_address else f"http://{api_address}").hostname
    if not host:
        return False
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return any(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses) or bool(addresses & _own_addresses())


def _own_addresses() -> set[str]:
    import psutil

    return {a.address.split("%")[0] for nics in psutil.net_if_addrs().values() for a in nics
            if a.family in (socket.AF_INET, socket.AF_INET6)}


def check(jobs: Any, python: str, runtime_env: dict[str, Any], chosen: str, timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """Run ``CHECK`` with ``python`` on the head as a job; raise PythonError naming the fix if it fails.

    ``chosen`` says where the interpreter came from, for the message. The check's job stays on the
    cluster, named for what it is (``CHECK_PREFIX``), and ``cuda-agent jobs list`` leaves it out:
    deleting it as soon as it ends races its supervisor's exit, which then records it again as
    FAILED."""
    check_id = f"{CHECK_PREFIX}{uuid.uuid4().hex[:8]}"
    jobs.submit_job(entrypoint=f"{shlex.quote(python)} -c {shlex.quote(CHECK)}", runtime_env=runtime_env,
                    submission_id=check_id, metadata={"command": "python-check"})
    deadline = time.monotonic() + timeout_s
    status = jobs.get_job_status(check_id)
    while not status.is_terminal() and time.monotonic() < deadline:
        time.sleep(0.5)
        status = jobs.get_job_status(check_id)
    if not status.is_terminal():
        jobs.stop_job(check_id)
        raise PythonError(f"job.python={python} ({chosen}): importing the project with it on the head did not finish "
                          f"within {timeout_s:g} s (the check's job {check_id}, {status.value}); see "
                          f"`cuda-agent jobs logs {check_id}`")
    if status.value != "SUCCEEDED":
        raise PythonError(failure_message(python, chosen, jobs.get_job_logs(check_id), jobs.get_job_info(check_id).message or ""))


def failure_message(python: str, chosen: str, output: str, message: str = "") -> str:
    """One line: the interpreter, where it came from, its last word on the check, and the fix."""
    said = next((line.strip() for line in reversed(output.splitlines()) if line.strip()), "") or message.strip()
    return (f"job.python={python} ({chosen}) cannot run cuda-agent on the head: `{python} -c \"{CHECK}\"` there "
            f"says: {said or 'nothing'}; set job.python to the head's interpreter of the project's environment "
            f"(e.g. job.python=/path/to/cuda-agent/.venv/bin/python, as `which python` prints it there)")
