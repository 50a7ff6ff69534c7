"""The interpreter of a job's driver (launch/job_python.py): which one, and what its check says when it cannot run it.

A head's bare `python` is whatever was on the PATH of `ray start`; a job run with one that
cannot import the project died in its first second (ModuleNotFoundError: omegaconf). The check
itself runs as a job (tests/test_job_submit.py); here, its choice and its message, from a real
interpreter's real failure.
"""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import psutil

from launch.job_python import CHECK, choose, failure_message

REPO = Path(__file__).resolve().parents[1]


def test_unset_it_is_this_interpreter_where_the_head_is_this_machine_else_python():
    assert choose("", "http://127.0.0.1:8265")[0] == sys.executable
    assert choose("", "http://localhost:8265")[0] == sys.executable
    own = next(a.address for nics in psutil.net_if_addrs().values() for a in nics
               if a.family == socket.AF_INET and not a.address.startswith("127."))
    assert choose("", f"http://{own}:8265")[0] == sys.executable, "the head's address as other nodes know it"
    python, chosen = choose("", "http://198.51.100.7:8265")  # a documentation address: never this machine
    assert python == "python" and "PATH of `ray start`" in chosen


def test_a_configured_one_is_kept_and_a_relative_path_means_where_it_was_typed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert choose("python3.11", "http://127.0.0.1:8265") == ("python3.11", "job.python")
    assert choose("/opt/env/bin/python", "http://198.51.100.7:8265")[0] == "/opt/env/bin/python"
    assert choose(".venv/bin/python", "http://127.0.0.1:8265")[0] == str(tmp_path / ".venv" / "bin" / "python")


def test_the_project_s_interpreter_passes_the_check_and_one_without_its_packages_is_told_the_fix():
    ok = subprocess.run([sys.executable, "-c", CHECK], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    bare = subprocess.run([sys.executable, "-S", "-c", CHECK], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert bare.returncode != 0
    message = failure_message("/usr/bin/python3", "job.python unset: `python` on the PATH of `ray start` on the head",
                              bare.stdout + bare.stderr)
    assert "\n" not in message and message.startswith("job.python=/usr/bin/python3 (job.python unset")
    assert "says: ModuleNotFoundError: No module named" in message and "set job.python to" in message
