"""A Ray head on this machine, started as README's "On a cluster" starts one.

``ray start --head --dashboard-host 0.0.0.0 --labels cuda-agent/role=learner``, from an
environment a new user would have: RAY_AUTH_MODE unset and a token in ``~/.ray/auth_token`` (an
earlier local run leaves one), so the head turns token authentication on by itself; and a PATH
without this interpreter's folder, so a bare ``python`` there is not the project's (a head
started from a shell where the venv is not active). Its own ports and temp dir, so that other
clusters on the machine are left alone; ``stop`` ends its processes and only those.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.two_node_cluster import NODE_PORT_FLAGS, free_ports, stop_processes

RAY = str(Path(sys.executable).parent / "ray")


def user_env(**extra: str) -> dict[str, str]:
    """This environment as a new user's shell has it: no RAY_AUTH_MODE or RAY_ADDRESS, no venv on the PATH."""
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    return {**env, "RAY_USAGE_STATS_ENABLED": "0", **extra}


class RayHead:
    def __init__(self, num_cpus: int):
        # Ray's socket paths must fit in 107 bytes: its temp dir goes in a short folder, not pytest's.
        self.base = Path(tempfile.mkdtemp(prefix="ca-head-", dir="/tmp"))
        ports = free_ports(3 + len(NODE_PORT_FLAGS))
        self.gcs_port, dashboard_port, self.client_port = ports[:3]
        self.node_ports = [f"{flag}={port}" for flag, port in zip(NODE_PORT_FLAGS, ports[3:])]
        self.dashboard = f"http://127.0.0.1:{dashboard_port}"
        self.num_cpus = num_cpus

    def start(self) -> "RayHead":
        env = user_env()
        # As a local `cuda-agent train` (ray.init) leaves it; kept if one is there already.
        subprocess.run([RAY, "get-auth-token", "--generate"], env=env, capture_output=True, check=True, timeout=120)
        started = subprocess.run(
            [RAY, "start", "--head", "--dashboard-host", "0.0.0.0", "--labels", "cuda-agent/role=learner",
             f"--port={self.gcs_port}", f"--dashboard-port={self.dashboard.rsplit(':', 1)[1]}",
             f"--ray-client-server-port={self.client_port}", f"--num-cpus={self.num_cpus}", "--num-gpus=0",
             f"--temp-dir={self.base}", "--disable-usage-stats", *self.node_ports],
            env=env, capture_output=True, text=True, timeout=180)
        if started.returncode != 0:
            self.stop()
            raise RuntimeError(f"ray start --head failed:\n{started.stdout[-2000:]}\n{started.stderr[-2000:]}")
        self.started_output = started.stdout + started.stderr
        self._wait_for_jobs_api()
        return self

    def _wait_for_jobs_api(self, timeout_s: float = 60.0) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:  # any answer, 401 included: the dashboard is up
                urllib.request.urlopen(f"{self.dashboard}/api/version", timeout=5)
                return
            except urllib.error.HTTPError:
                return
            except OSError:
                time.sleep(1.0)
        raise RuntimeError(f"the head's Jobs API at {self.dashboard} did not answer in {timeout_s:g} s")

    def stop(self) -> None:
        stop_processes((str(self.base), f":{self.gcs_port}"))
        shutil.rmtree(self.base, ignore_errors=True)
