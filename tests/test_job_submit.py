"""`cuda-agent submit` and `cuda-agent jobs` against a head started as README says (tests/ray_head.py).

The head turns token authentication on by itself (a token in ~/.ray/auth_token, RAY_AUTH_MODE
unset), and a bare `python` on its PATH is not the project's. Every command runs as a user runs
it: the console script, in a folder of its own (relative paths are typed there), with no
RAY_AUTH_MODE and no job.python:
- `jobs list` reaches the head with the token Ray's own loader finds; a token that is not the
  cluster's is one line naming the fix;
- `submit` refuses a job.python that cannot import the project, before any job exists;
- slow: train, eval and synth jobs each reach SUCCEEDED with their outputs in the run folder,
  the paths typed relative to the submitter's folder read there (the cache, the solutions, the
  KernelBench folder of synth's contamination screen).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.ray_head import RayHead, user_env

REPO = Path(__file__).resolve().parents[1]
STARTER = REPO / "tasks" / "starter" / "level1"
LEGIT = REPO / "tests" / "env_corpus" / "legit"


@pytest.fixture(scope="module")
def head():
    # cpu-demo reserves 5 logical CPUs (2 for the generator, 1 env worker, 2 for the learner, taking
    # turns on a 2-core machine): more than Ray finds on one, so the head says how many it has.
    node = RayHead(num_cpus=5).start()
    try:
        yield node
    finally:
        node.stop()


def cuda_agent(*args: str, cwd: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """The console script as a user runs it (this checkout first on the path)."""
    script = Path(sys.executable).parent / "cuda-agent"
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "launch.cli"]
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run([*argv, *args], cwd=cwd, env=user_env(PYTHONPATH=path, COLUMNS="200", **env),
                          capture_output=True, text=True, timeout=timeout)


def listed(head: RayHead, cwd: Path) -> dict[str, dict]:
    done = cuda_agent("jobs", "list", "--json", "--address", head.dashboard, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    return {j["id"]: j for j in json.loads(done.stdout)}


def test_the_head_turned_token_authentication_on_and_jobs_list_sends_the_token(head, tmp_path):
    assert "Token authentication is enabled" in head.started_output, "the head must run with token authentication"
    done = cuda_agent("jobs", "list", "--address", head.dashboard, cwd=tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]


@pytest.mark.parametrize("case, said", [
    ("another token", "refused the authentication token here (RAY_AUTH_TOKEN): it is not the cluster's"),
    ("no token", "requires an authentication token and there is none here"),
    ("disabled here", "RAY_AUTH_MODE=disabled here keeps it from being sent: unset RAY_AUTH_MODE"),
])
def test_a_missing_or_wrong_token_is_one_line_naming_the_fix(head, tmp_path, case, said):
    env = {"another token": {"RAY_AUTH_TOKEN": "0" * 32}, "no token": {"HOME": str(tmp_path)},
           "disabled here": {"RAY_AUTH_MODE": "disabled"}}[case]
    done = cuda_agent("jobs", "list", "--address", head.dashboard, cwd=tmp_path, **env)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr[-3000:]
    assert said in done.stderr and ("ray get-auth-token" in done.stderr or case == "disabled here"), done.stderr


def test_submit_refuses_a_python_that_cannot_import_the_project_before_the_job_exists(head, tmp_path):
    # A real interpreter without site-packages: it cannot import omegaconf, as a head's system Python cannot.
    bare = tmp_path / "bare-python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    bare.chmod(0o755)
    before = set(listed(head, tmp_path))
    done = cuda_agent("submit", "synth", "job.python=./bare-python", "synth.tasks=1",
                      "--address", head.dashboard, cwd=tmp_path)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    error = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert error and f"job.python={bare}" in error[0] and "No module named" in error[0], done.stderr[-3000:]
    assert "set job.python to the head's interpreter" in error[0] and "Traceback" not in done.stderr
    assert set(listed(head, tmp_path)) == before, "no job was submitted (and the check's own job is not listed)"


@pytest.mark.slow
@pytest.mark.timeout(3000)  # three jobs on 2 cores: a training stage, an evaluation, a synthesis
def test_train_eval_and_synth_jobs_succeed_as_readme_submits_them(head, tmp_path, tiny_model_dir):
    solutions = tmp_path / "solutions" / "01_gelu"
    solutions.mkdir(parents=True)
    for name in ("model_new.py", "kernel.cpp"):
        shutil.copy(LEGIT / "gelu_omp" / name, solutions / name)
    (tmp_path / "kb" / "level1").mkdir(parents=True)  # synth's contamination screen reads it, typed relative
    shutil.copy(STARTER / "02_swish.py", tmp_path / "kb" / "level1" / "23_Swish.py")
    common = ["cpu-demo", "storage.root=runs", "env.work_dir=env-cache", "logging.progress=false"]
    submitted = {}
    started = time.monotonic()

    def submit(command: str, *items: str) -> str:
        done = cuda_agent("submit", command, *common, *items, "--address", head.dashboard, cwd=tmp_path)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        assert "Token authentication" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
        job = re.search(r"submitted \w+ as job (raysubmit_\w+)", done.stdout).group(1)
        submitted[job] = command
        return job

    def wait(job: str, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            row = listed(head, tmp_path)[job]
            if row["status"] in ("SUCCEEDED", "FAILED", "STOPPED"):
                logs = cuda_agent("jobs", "logs", job, "--address", head.dashboard, cwd=tmp_path).stdout
                assert row["status"] == "SUCCEEDED", f"{submitted[job]}: {row['message'][-1500:]}\n{logs[-3000:]}"
                assert "Token authentication" not in logs, "the job's driver joins its cluster without Ray's warning"
                print(f"[timing] {submitted[job]} job: {time.monotonic() - started:.0f} s since the first submit")
                return row
            time.sleep(5.0)
        raise AssertionError(f"{submitted[job]} did not end within {timeout_s:g} s")

    train = submit("train", f"model.path={tiny_model_dir}", "stage.name=single_turn_ppo", "stage.steps=1",
                   "rollout.max_new_tokens=24", "rollout.max_context_tokens=4096", "rollout.kv_cache_gib=0.25",
                   "logging.out_dir=runs/train")
    run = Path(wait(train, 1500)["run_dir"])
    assert run == tmp_path / "runs" / "runs" / "train"
    assert json.loads((run / "recipe.json").read_text())["done"] == ["single_turn_ppo"]
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1]

    # The evaluation and the synthesis side by side: 1 CPU and 2 of the head's 5.
    evaluation = submit("eval", "eval.audit=false", "eval.max_autotune=false", "eval.infra_retries=0",
                        "--solutions", "solutions", "--tasks", str(STARTER / "01_gelu.py"))
    synthesis = submit("synth", "synth.tasks=2", "synth.kernelbench_dir=kb")
    out = Path(wait(evaluation, 1200)["run_dir"])
    assert (out / "report.md").exists() and (out / "report.html").exists()
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    # Its verdict may be infra on a machine shared with other work; that it was evaluated is the point here.
    assert [r["task_id"] for r in records] == ["01_gelu"] and records[0]["failure"] in (None, "infra"), records
    assert json.loads((out / "sweep.json").read_text())["policy"] == f"solutions:{tmp_path / 'solutions'}"
    assert any((tmp_path / "env-cache").iterdir()), "env.work_dir, typed relative, is where it was typed"

    report = json.loads((Path(wait(synthesis, 1200)["run_dir"]) / "report.json").read_text())
    assert report["stages"]["accepted"] == 2 and report["finished"] is True, report
    assert report["kernelbench_screen"] == str(tmp_path / "kb"), "synth.kernelbench_dir, typed relative, was read"
    assert len(list(Path(report["task_folder"]).glob("*.py"))) == 2
