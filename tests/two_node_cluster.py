"""A real two-node Ray cluster on this machine, where the second node does not see the run folder.

``ray start --head`` makes the first node, labelled ``cuda-agent/role=rollout``; a second
``ray start --address`` makes the other, labelled ``cuda-agent/role=learner``, with its own
resources and temp dir. The second node's processes live in their own mount namespace in which
``hidden`` is an empty tmpfs: whatever they write there the head never sees, and whatever the
head writes there they cannot read. So the second node shares no output path with the driver,
as on two machines without a shared disk. Needs root (a mount namespace), like the sandbox.
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROLE = "cuda-agent/role"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_ports() -> list[str]:
    """Ports of a node's own servers: two nodes on one machine must not ask for the same ones."""
    flags = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
             "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port")
    return [f"{flag}={free_port()}" for flag in flags]


class TwoNodeCluster:
    def __init__(self, hidden: Path, head_cpus: int = 3, second_cpus: int = 2):
        # Ray's socket paths must fit in 107 bytes: its temp dirs go in a short folder, not pytest's.
        self.base, self.hidden = Path(tempfile.mkdtemp(prefix="ca2n-", dir="/tmp")), hidden
        self.gcs_port, self.dashboard_port = free_port(), free_port()
        self.address = f"127.0.0.1:{self.gcs_port}"
        self.dashboard = f"http://127.0.0.1:{self.dashboard_port}"
        self.head_cpus, self.second_cpus = head_cpus, second_cpus
        bin_dir = str(Path(sys.executable).parent)
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "RAY_USAGE_STATS_ENABLED": "0"}
        self.env.pop("RAY_ADDRESS", None)

    def start(self) -> "TwoNodeCluster":
        ray = str(Path(sys.executable).parent / "ray")
        (self.base / "head").mkdir(parents=True, exist_ok=True)
        (self.base / "second").mkdir(parents=True, exist_ok=True)
        self.hidden.mkdir(parents=True, exist_ok=True)
        self._run([ray, "start", "--head", f"--port={self.gcs_port}", f"--dashboard-port={self.dashboard_port}",
                   "--include-dashboard=true", f"--ray-client-server-port={free_port()}", f"--num-cpus={self.head_cpus}",
                   "--num-gpus=0", f"--labels={ROLE}=rollout", f"--temp-dir={self.base / 'head'}",
                   "--disable-usage-stats", *node_ports()])
        second = [ray, "start", f"--address={self.address}", f"--num-cpus={self.second_cpus}", "--num-gpus=0",
                  f"--labels={ROLE}=learner", f"--temp-dir={self.base / 'second'}", "--disable-usage-stats", *node_ports()]
        script = f"mount -t tmpfs cuda-agent-hidden {shlex.quote(str(self.hidden))} && exec {shlex.join(second)}"
        self._run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script])
        self._wait_for_nodes(2)
        return self

    def _run(self, argv: list[str]) -> None:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            self.stop()
            raise RuntimeError(f"{' '.join(argv[:3])} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")

    def _wait_for_nodes(self, count: int, timeout_s: float = 60.0) -> None:
        ray = str(Path(sys.executable).parent / "ray")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = subprocess.run([ray, "status", f"--address={self.address}"], env=self.env, capture_output=True,
                                  text=True, timeout=60)
            if done.stdout.count(" node_") >= count:
                return
            time.sleep(1.0)
        raise RuntimeError(f"the cluster did not reach {count} nodes in {timeout_s:g} s")

    def stop(self) -> None:
        """Every process of this cluster (found by its temp dirs), and only those: other Ray clusters stay."""
        marks = (str(self.base / "head"), str(self.base / "second"), f":{self.gcs_port}")
        mine = []
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = " ".join(proc.info["cmdline"] or [])
            if proc.pid != os.getpid() and any(m in cmdline for m in marks):
                mine.append(proc)
        for proc in list(mine):  # agents and workers rename themselves (ray::...): found as children
            try:
                mine += [c for c in proc.children(recursive=True) if c.pid != os.getpid() and c not in mine]
            except psutil.NoSuchProcess:
                pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for proc in mine:
                try:
                    proc.send_signal(sig)
                except psutil.NoSuchProcess:
                    pass
            _, mine = psutil.wait_procs(mine, timeout=10)
        shutil.rmtree(self.base, ignore_errors=True)
