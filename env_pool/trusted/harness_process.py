"""The worker's trusted harness process: started on first use, kept warm, restarted when it fails.

A harness imports torch, builds each task's reference and round memory, and (on a GPU) holds a
CUDA context: seconds of work that a fresh process per evaluation paid every time. One harness
per worker serves evaluations one at a time (the caller holds the timing lane), over frames of
length-prefixed msgpack: requests on its stdin, verdicts on a pipe of their own (its stdout and
stderr, where a task's reference may print, go to a log file).

It is trusted code, so it may stay warm; the candidates it serves never run in it. Blocking I/O
in a thread (the caller uses asyncio.to_thread): an evaluation context outlives event loops
(tests run each evaluation under its own asyncio.run), which an asyncio subprocess cannot.
"""
from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import msgpack

from env_pool.isolation import host_pressure
from env_pool.trusted.harness_request import HarnessRequest

COMMAND = [sys.executable, "-m", "env_pool.trusted.harness", "--serve"]
MAX_FRAME = 256 << 20  # a verdict is kilobytes; anything near this is a broken harness
IDLE_END_S = 3.0  # after its worker is gone, how long a harness may take to end by itself before it is killed


class HarnessGone(Exception):
    """The harness died, hung past its limit, or broke the framing: the evaluation is infra."""


class HarnessProcess:
    def __init__(self, log_path: Path, cpus: list[int] | None = None, env: dict[str, str] | None = None):
        self.log_path, self.cpus, self.env = log_path, cpus, env
        self.proc: subprocess.Popen | None = None
        self.responses = -1
        self.lock = threading.Lock()
        self.starts = 0  # how many times a harness was started (1 while it stays healthy)
        self._finalizer: weakref.finalize | None = None

    def request(self, request: HarnessRequest, timeout_s: float) -> dict:
        """Send one evaluation, wait for its verdict; a dead or hung harness is killed and reported as infra."""
        with self.lock:
            try:
                if self.proc is None or self.proc.poll() is not None:
                    self._start()
                _write_frame(self.proc.stdin, request.to_wire())
                return _read_frame(self.responses, time.monotonic() + timeout_s)
            except (HarnessGone, OSError, ValueError) as err:
                exit_code = self.proc.poll() if self.proc is not None else None
                self.close()
                # A harness that hung or died on a machine out of memory or CPUs: say so, here and in its log.
                machine = host_pressure.note(list(request.cpus) or None)
                why = f"{err}; exit {exit_code}" + (f"; the machine: {machine}" if machine else "")
                self.record(f"the harness failed ({why})")
                return {"ok": False, "failure": "infra", "message": f"the harness failed ({why}); see {self.log_path}"}

    def record(self, line: str) -> None:
        """A line of the worker's own in harness.log, beside the harness's (appended: the harness may be writing too)."""
        with contextlib.suppress(OSError), open(self.log_path, "a") as log:
            log.write(f"{time.strftime('%H:%M:%S')} worker: {line}\n")

    def _start(self) -> None:
        self.close()
        read_end, write_end = os.pipe()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **(self.env or {}), "CUDA_AGENT_HARNESS_FD": str(write_end)}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(COMMAND, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                         pass_fds=(write_end,), env=env, start_new_session=True)
        os.close(write_end)
        self.responses = read_end
        self.starts += 1
        if self.cpus:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(self.proc.pid, self.cpus)
        self._finalizer = weakref.finalize(self, _kill, self.proc, read_end)

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # kills the process group and closes the pipe, once
            self._finalizer = None
        self.proc, self.responses = None, -1


def _kill(proc: subprocess.Popen, fd: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)
    with contextlib.suppress(OSError):
        os.close(fd)


def _write_frame(stream, payload: Any) -> None:
    data = msgpack.packb(payload)
    stream.write(len(data).to_bytes(8, "little") + data)
    stream.flush()


def _read_frame(fd: int, deadline: float) -> dict:
    size = int.from_bytes(_read_exactly(fd, 8, deadline), "little")
    if size > MAX_FRAME:
        raise HarnessGone(f"a {size}-byte verdict")
    value = msgpack.unpackb(_read_exactly(fd, size, deadline))
    if not isinstance(value, dict):
        raise HarnessGone("a verdict that is not a map")
    return value


def _read_exactly(fd: int, n: int, deadline: float) -> bytes:
    chunks, got = [], 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise HarnessGone("no verdict within its time limit")
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise HarnessGone("it exited")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


# ----------------------------------------------------------------------------- the harness's side

def serve_forever(handle) -> None:
    """In the harness: answer framed requests on stdin with ``handle(payload)`` until stdin closes.

    Stdin closes when the worker exits, however it exits: that ends the harness, at once, even
    mid-request (``_end_with_worker``). (Not PR_SET_PDEATHSIG: it fires when the *thread* that
    started the process ends, and the worker starts it from a short-lived executor thread.)
    """
    responses = os.fdopen(int(os.environ.pop("CUDA_AGENT_HARNESS_FD")), "wb")
    requests = sys.stdin.buffer
    threading.Thread(target=_end_with_worker, args=(requests.fileno(),), daemon=True, name="end-with-worker").start()
    while True:
        header = requests.read(8)
        if len(header) < 8:
            return
        payload = msgpack.unpackb(requests.read(int.from_bytes(header, "little")))
        _write_frame(responses, handle(payload))
        sys.stdout.flush()


def _end_with_worker(requests_fd: int) -> None:
    """In the harness: when the worker's end of stdin closes (it exited, crashed or was killed), end now.

    Reading stdin notices only between requests, and a request lasts minutes (a task's
    baselines): a harness whose worker was killed mid-request went on serving it, its servers
    with it, until its verdict hit a broken pipe (issue #32). poll() with no events asked for
    still reports the hang-up, without taking a byte of a request. SIGKILL to the harness's own
    process group (it leads one) takes whatever it started there; its sandboxed servers, each
    in a session of its own, die with it (their shims' PR_SET_PDEATHSIG, then their PID namespaces).
    """
    poller = select.poll()
    poller.register(requests_fd, 0)
    while not poller.poll():
        pass
    time.sleep(IDLE_END_S)  # an idle harness reads the end of stdin too, and closes its warm servers itself
    print(f"{time.strftime('%H:%M:%S')} harness: the worker is gone (stdin closed); ending, servers and all", flush=True)
    os.killpg(os.getpgrp(), signal.SIGKILL)
