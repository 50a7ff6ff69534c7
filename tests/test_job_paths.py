"""`cuda-agent submit` resolves every path a job reads or writes where it was typed (launch/job_paths.py).

The job's driver runs on the head in a temporary copy of the package: a path left relative
would be read against that copy. No cluster is needed to check what the job is given.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from launch.jobs import cluster_config, job_argv

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def typed_in(monkeypatch):
    """Run what follows in a folder, as a user who typed the command there (made if missing)."""
    def go(folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        monkeypatch.chdir(folder)
        return folder
    return go


def test_relative_paths_are_taken_against_the_folder_submit_was_typed_in(tmp_path, typed_in):
    here = typed_in(tmp_path / "here")
    cfg = cluster_config([], ["synth.kernelbench_dir=../kb", "model.path=models/m", "model.critic_path=critic",
                              "stage.tasks=[problems,/abs/p]", "eval.heldout_tasks=[held]", "eval.policy=replay:answers.json",
                              "env.work_dir=cache/env", "storage.node_dir=copies", "eval.out_dir=sweep"])
    assert cfg.synth.kernelbench_dir == str(tmp_path / "kb"), "read in the job, it named nothing there"
    assert cfg.model.path == str(here / "models" / "m") and cfg.model.critic_path == str(here / "critic")
    assert list(cfg.stage.tasks) == [str(here / "problems"), "/abs/p"] and list(cfg.eval.heldout_tasks) == [str(here / "held")]
    assert cfg.eval.policy == f"replay:{here / 'answers.json'}"
    assert cfg.env.work_dir == str(here / "cache" / "env") and cfg.storage.node_dir == str(here / "copies")
    assert cfg.storage.root == str(here) and cfg.eval.out_dir == str(here / "sweep")


def test_the_default_kernelbench_folder_is_the_one_next_to_where_submit_runs(tmp_path, typed_in):
    typed_in(tmp_path / "cuda-agent")
    assert cluster_config([], []).synth.kernelbench_dir == str(tmp_path / "shared" / "kernelbench")


def test_paths_in_the_package_stay_relative_to_it_where_the_job_carries_them(tmp_path, typed_in):
    typed_in(REPO)
    cfg = cluster_config([], ["stage.tasks=[tasks/starter,runs/mine,.venv/lib,tests/__pycache__/x]"])
    # The job runs in the package's copy: tasks/starter is there on any head; runs/, .venv and
    # __pycache__ are left out of the upload (job.excludes, .gitignore), so those are made absolute.
    assert list(cfg.stage.tasks) == ["tasks/starter", str(REPO / "runs" / "mine"), str(REPO / ".venv" / "lib"),
                                     str(REPO / "tests" / "__pycache__" / "x")]
    typed_in(REPO / "tasks")
    assert list(cluster_config([], ["eval.tasks=[starter/level1]"]).eval.tasks) == ["tasks/starter/level1"]
    typed_in(tmp_path)
    outside = cluster_config([], ["stage.tasks=[tasks/starter]"])
    assert list(outside.stage.tasks) == [str(tmp_path / "tasks" / "starter")], "typed elsewhere, it means there"


def test_home_folders_and_values_that_name_no_path_are_left_for_the_node(tmp_path, typed_in):
    typed_in(tmp_path)
    cfg = cluster_config([], ['env.pch_dir=""', "synth.policy=vllm:embedded", "eval.policy=openai:http://h:8000/v1#m"])
    assert cfg.model.path == "embedded" and cfg.model.cache_dir == "~/.cache/cuda-agent"  # each node's own home
    assert cfg.env.pch_dir == "" and cfg.model.critic_path is None
    assert cfg.synth.policy == "vllm:embedded" and cfg.eval.policy == "openai:http://h:8000/v1#m"


def test_evals_options_are_resolved_as_the_config_is(tmp_path, typed_in):
    typed_in(tmp_path)
    cfg = cluster_config([], ["storage.root=/data/runs"])
    argv = job_argv("eval", "vllm:models/q", ["problems", "tasks/starter"], "solutions", "out", cfg)
    assert argv == ["eval", "--policy", f"vllm:{tmp_path / 'models' / 'q'}", "--solutions", str(tmp_path / "solutions"),
                    "--out", "/data/runs/out", "--tasks", str(tmp_path / "problems"), str(tmp_path / "tasks" / "starter")]
    typed_in(REPO)
    assert job_argv("eval", None, ["tasks/starter"], "tests/env_corpus/legit", None, cfg) == \
        ["eval", "--solutions", "tests/env_corpus/legit", "--tasks", "tasks/starter"]


# Every string-valued key of the schema that names no path, so that a new key is classified when it is added.
NOT_PATHS = {"model.dtype", "cluster.address", "rollout.logprobs_mode", "rollout.weight_swap_mode",
             "rollout.openai_api_key_env", "env.compile_mode", "learner.attn_implementation", "job.address",
             "job.excludes", "logging.level", "env.verifier.answer_file"}  # answer_file: a name in the workspace


def test_every_string_key_of_the_schema_is_resolved_as_a_path_or_named_as_none():
    from configs.load import valid_keys
    from launch.job_paths import PATH_KEYS

    strings = {key for key, annotation in valid_keys().items()
               if str(annotation) in ("str", "Optional[str]", "list[str]") or annotation in (str, list[str])}
    unclassified = strings - set(PATH_KEYS) - NOT_PATHS
    assert not unclassified, (f"{sorted(unclassified)}: a path? add it to launch/job_paths.py (READ, READ_LISTS, SPECS "
                              f"or WRITTEN); if not, to NOT_PATHS here")
    assert not set(PATH_KEYS) & NOT_PATHS and set(PATH_KEYS) <= strings
