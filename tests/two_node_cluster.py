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

ROLE = "cuda-agent/role"  # as the shipped multi-node configs use it
NODE = "cluster-test/node"
AUTH_MODE = "token"  # the processes that talk to the cluster set RAY_AUTH_MODE to this too  # head or second: for tests that put a role where its usual label would not


def free_ports(count: int) -> list[int]:
    """Distinct free ports: each held until all are found, so none is handed out twice."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


NODE_PORT_FLAGS = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
                   "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port")


class TwoNodeCluster:
    def __init__(self, hidden: Path, head_cpus: int = 3, second_cpus: int = 2):
        # Ray's socket paths must fit in 107 bytes: its temp dirs go in a short folder, not pytest's.
        self.base, self.hidden = Path(tempfile.mkdtemp(prefix="ca2n-", dir="/tmp")), hidden
        ports = free_ports(3 + 2 * len(NODE_PORT_FLAGS))
        self.gcs_port, self.dashboard_port, self.client_port = ports[:3]
        # Ports of each node's own servers: two nodes on one machine must not ask for the same ones.
        self.head_ports, self.second_ports = ([f"{flag}={port}" for flag, port in zip(NODE_PORT_FLAGS, ports[at:])]
                                              for at in (3, 3 + len(NODE_PORT_FLAGS)))
        self.address = f"127.0.0.1:{self.gcs_port}"
        self.dashboard = f"http://127.0.0.1:{self.dashboard_port}"
        self.head_cpus, self.second_cpus = head_cpus, second_cpus
        bin_dir = str(Path(sys.executable).parent)
        # Token auth on, and said so everywhere: Ray 2.60 turns it on for any local ray.init (and
        # for a head that finds ~/.ray/auth_token) but not for a node that joins, which then cannot;
        # and a process that ran a local cluster in token mode cannot use one without it.
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "RAY_USAGE_STATS_ENABLED": "0",
                    "RAY_AUTH_MODE": AUTH_MODE}
        self.env.pop("RAY_ADDRESS", None)

    def start(self) -> "TwoNodeCluster":
        ray = str(Path(sys.executable).parent / "ray")
        self._run([ray, "get-auth-token", "--generate"])  # ~/.ray/auth_token, as a local ray.init makes it
        (self.base / "head").mkdir(parents=True, exist_ok=True)
        (self.base / "second").mkdir(parents=True, exist_ok=True)
        self.hidden.mkdir(parents=True, exist_ok=True)
        self._run([ray, "start", "--head", f"--port={self.gcs_port}", f"--dashboard-port={self.dashboard_port}",
                   "--include-dashboard=true", f"--ray-client-server-port={self.client_port}", f"--num-cpus={self.head_cpus}",
                   "--num-gpus=0", f"--labels={ROLE}=rollout,{NODE}=head", f"--temp-dir={self.base / 'head'}",
                   "--disable-usage-stats", *self.head_ports])
        second = [ray, "start", f"--address={self.address}", f"--num-cpus={self.second_cpus}", "--num-gpus=0",
                  f"--labels={ROLE}=learner,{NODE}=second", f"--temp-dir={self.base / 'second'}", "--disable-usage-stats",
                  *self.second_ports]
        script = f"mount -t tmpfs cuda-agent-hidden {shlex.quote(str(self.hidden))} && exec {shlex.join(second)}"
        # Once more if the first try cannot reach the head's GCS: seen once on a busy 2-core machine.
        self._run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], tries=2)
        self._wait_for_nodes(2)
        return self

    def _run(self, argv: list[str], tries: int = 1) -> None:
        for attempt in range(tries):
            done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=120)
            if done.returncode == 0:
                return
            time.sleep(2.0)
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
        stop_processes((str(self.base / "head"), str(self.base / "second"), f":{self.gcs_port}"))
        shutil.rmtree(self.base, ignore_errors=True)


def stop_processes(marks: tuple[str, ...]) -> None:
    """Every process whose command line holds one of ``marks`` (a cluster's temp dirs, its GCS port), and their
    descendants: SIGTERM, then SIGKILL for those still there after 10 s."""
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
