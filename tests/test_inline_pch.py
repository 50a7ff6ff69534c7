"""The precompiled torch/extension.h (env_pool/build/inline_pch.py): built on the trusted side, used by load_inline's own builds."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from env_pool.build import inline_pch
from env_pool.pool import EnvPool
from tasks.loader import load_tasks
from tests.process_census import census, header_jobs, remaining, wait_for

REPO = Path(__file__).resolve().parents[1]

REPORTER = '''"""Names torch.utils.cpp_extension, so its import is the build step; it shows what that step was given."""
import os

raise RuntimeError("CPATH=" + os.environ.get("CPATH", "<unset>"))
'''

LOAD_INLINE = r'''
import sys
from torch.utils.cpp_extension import load_inline
load_inline(name="pch_probe_ext", cpp_sources="#include <torch/extension.h>\nint twice(int x) { return 2 * x; }", functions=["twice"],
            extra_cflags=["-O3", "-H"], build_directory=sys.argv[1], verbose=True)
'''


def test_the_flags_are_load_inlines_own_less_the_extensions_name():
    compiler, flags, key = inline_pch.target(False)
    assert compiler and key
    assert "-DTORCH_API_INCLUDE_EXTENSION_H" in flags and any(f.startswith("-std=") for f in flags)
    assert not any(f.startswith("-DTORCH_EXTENSION_NAME") for f in flags)


def test_only_a_checked_build_is_used(tmp_path):
    _, _, key = inline_pch.target(False)
    folder = tmp_path / key
    folder.mkdir()
    (folder / "failed").write_text("the probe did not use it")
    assert inline_pch.ready_dir(tmp_path, "cpp") is None
    assert not (tmp_path / f"{key}.log").exists(), "a failed build is not retried on every evaluation"
    (folder / "failed").unlink()
    (folder / "ok").write_text("checked")
    assert inline_pch.ready_dir(tmp_path, "cpp") == folder


def test_the_import_step_gets_the_ready_folder_on_cpath(tmp_path):
    pch_root = tmp_path / "pch"
    ready = pch_root / inline_pch.target(False)[2]
    ready.mkdir(parents=True)
    (ready / "ok").write_text("checked")
    task = next(t for t in load_tasks()[0] if t.id == "level1/01_gelu")
    for root, expected in ((str(pch_root), f"CPATH={ready}"), ("", "CPATH=<unset>")):
        pool = EnvPool({"work_dir": str(tmp_path / "work"), "pch_dir": root, "infra_retries": 0})
        result = asyncio.run(pool.evaluate(task, {"model_new.py": REPORTER}, "compile"))
        assert result.failure == "compile_error" and expected in result.message + result.compile_log, result.message


@pytest.mark.slow
def test_a_built_header_is_used_by_a_real_load_inline_build(tmp_path):
    compiler, flags, key = inline_pch.target(False)
    folder = tmp_path / key
    assert inline_pch.build(folder, compiler, flags), (folder / "failed").read_text()
    assert {p.name for p in (folder / "torch" / "extension.h.gch").iterdir()} == {"plain.gch", "optimized.gch"}
    build_dir = tmp_path / "ext"
    build_dir.mkdir()
    done = subprocess.run([sys.executable, "-c", LOAD_INLINE, str(build_dir)], capture_output=True, text=True,
                          env={**os.environ, "CPATH": str(folder)}, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    used = f"! {folder / 'torch' / 'extension.h.gch' / 'optimized.gch'}"
    assert used in done.stdout + done.stderr, "GCC's -H marks a precompiled header it used with '!'"
    assert Path(build_dir / "pch_probe_ext.so").exists()


COMMAND = "import sys; from pathlib import Path; from env_pool import inline_pch; print(inline_pch.ready_dir(Path(sys.argv[1]), 'cpp'))"


def start_commands(root: Path, count: int, tag: str) -> None:
    """``count`` processes that each look for the header, as a command's first load_inline import does, then exit."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
           "CUDA_AGENT_LIFETIME_TEST": tag}
    commands = [subprocess.Popen([sys.executable, "-c", COMMAND, str(root)], env=env, stdout=subprocess.PIPE, text=True)
                for _ in range(count)]
    for command in commands:
        out, _ = command.communicate(timeout=120)
        assert command.returncode == 0 and out.strip() == "None", "a command goes on without the header meanwhile"


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_two_commands_at_once_build_the_header_once_in_a_job_that_outlives_them(tmp_path):
    tag, key = uuid.uuid4().hex, inline_pch.target(False)[2]
    start_commands(tmp_path, 2, tag)
    left, job = census(tmp_path, tag)
    assert not left, "the commands left processes of their own:\n" + "\n".join(map(str, left))
    assert len(header_jobs(job)) == 1, "one job builds the header after both commands exited:\n" + "\n".join(map(str, job))
    deadline = time.monotonic() + 1080
    while census(tmp_path, tag)[1] and time.monotonic() < deadline:
        assert len(header_jobs(census(tmp_path, tag)[1])) <= 1, "one job at a time"
        time.sleep(2)
    log = (tmp_path / f"{key}.log").read_text()
    assert (tmp_path / key / "ok").exists(), log
    assert log.count("started for") == 1 and log.count("plain: built") == 1 and log.count("optimized: built") == 1, log
    assert not (tmp_path / f"{key}.partial").exists() and not list((tmp_path / key).glob("*.checked"))
    assert not any(census(tmp_path, tag)), "the job ended when its header was built"


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_killed_job_takes_its_compilers_along_and_the_next_one_resumes(tmp_path):
    tag, key = uuid.uuid4().hex, inline_pch.target(False)[2]
    start_commands(tmp_path, 1, tag)
    log = tmp_path / f"{key}.log"
    assert wait_for(lambda: "plain: built" in log.read_text(), 900, poll_s=1.0), log.read_text()
    compiling = wait_for(lambda: [p for p in census(tmp_path, tag)[1] if "cc1plus" in p.args], 60)
    assert compiling, "the optimized variant's compiler runs"
    [job] = header_jobs(census(tmp_path, tag)[1])
    os.kill(job.pid, signal.SIGKILL)
    left = remaining(tmp_path, tag, 15, job_too=True)
    assert not left, "SIGKILL of the job left its compilers:\n" + "\n".join(map(str, left))
    start_commands(tmp_path, 1, tag)  # a later command finds the lock free: no job is alive
    assert wait_for(lambda: (tmp_path / key / "ok").exists(), 900, poll_s=2.0), log.read_text()
    resumed = log.read_text().split("started for")[-1]
    assert "plain: kept from an earlier job" in resumed and "optimized: built" in resumed, log.read_text()
    assert not remaining(tmp_path, tag, 30, job_too=True)
