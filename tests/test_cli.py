"""The `cuda-agent` console script, run as a user runs it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

CLI = str(Path(sys.executable).with_name("cuda-agent"))


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=300)


def test_config_show_prints_the_resolved_config_with_overrides():
    out = run("config", "show", "cpu-demo", "rollout.max_turns=9")
    assert out.returncode == 0, out.stderr
    shown = yaml.safe_load(out.stdout)
    assert shown["rollout"]["max_turns"] == 9  # override
    assert shown["rollout"]["episodes_in_flight"] == 2  # from cpu-demo.yaml
    assert shown["rollout"]["top_p"] == 1.0  # default
    assert "# agent turns per training episode" in out.stdout


def test_config_show_rejects_a_typo_with_a_suggestion_and_exit_code_2():
    out = run("config", "show", "rollout.max_turn=9")
    assert out.returncode == 2
    assert "did you mean 'rollout.max_turns'" in out.stderr


def test_tasks_list_json_reports_tasks_and_failures(tmp_path: Path):
    (tmp_path / "broken.py").write_text("class Model: pass\n")
    out = run("tasks", "list", "--json", str(tmp_path))
    assert out.returncode == 1  # a failure is reported, and the exit code says so
    report = json.loads(out.stdout)
    assert report["tasks"] == [] and "missing get_inputs" in report["failures"][0]["reason"]


def test_tasks_list_shows_the_starter_set_with_shapes():
    out = run("tasks", "list", "--json", "--backend", "cuda")
    assert out.returncode == 0, out.stderr
    tasks = json.loads(out.stdout)["tasks"]
    assert len(tasks) >= 24 and all(t["inputs"] for t in tasks)
    assert all(t["entry"]["model"] == "Model" for t in tasks)


def test_doctor_reports_versions_and_backends():
    out = run("doctor", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["packages"]["torch"] and report["packages"]["ray"].startswith("2.60")
    assert report["backends"]["cpp"] == "ok"
    assert set(report["backends"]) == {"cpp", "cuda"}


def test_env_eval_names_a_missing_folder_or_problem_file_in_one_line():
    missing_folder = run("env", "eval", "level1/01_gelu", "/nonexistent-solution")
    missing_problem = run("env", "eval", "/nonexistent/19_ReLU.py", "tests/env_corpus/legit/gelu_omp")
    for out, what in ((missing_folder, "solution folder"), (missing_problem, "problem file")):
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert what in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
