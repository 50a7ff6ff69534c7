"""Task synthesis (tasks/synth, launch/synth.py): crawl, compose, every filter's rejection with its reason, dedup, resume."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.loader import load_tasks, parse_task
from tasks.synth.catalogue import crawl, write_catalogue
from tasks.synth.compose import Candidate, compose, sized
from tasks.synth.filters import dynamic_problem, static_problem
from tasks.synth.pipeline import SynthRun
from tasks.synth.similarity import SimilarityIndex, exact_key, kernelbench_index

KERNELBENCH = Path(__file__).resolve().parents[2] / "shared" / "kernelbench"

GOOD = '''import torch
import torch.nn as nn

batch_size = 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return {body}


def get_inputs():
    return [torch.randn(batch_size, {dims})]


def get_init_inputs():
    return []
'''


def program(body: str = "torch.tanh(x) * 2.0", dims: str = "4096") -> str:
    return GOOD.format(body=body, dims=dims)


@pytest.fixture(scope="module")
def catalogue():
    return crawl()


def test_the_crawl_keeps_operators_with_recipes_and_says_why_it_drops_the_rest(catalogue, tmp_path):
    ops, excluded = catalogue
    names = {op.name for op in ops}
    assert {"nn.Linear", "nn.GELU", "nn.LayerNorm", "F.softplus", "torch.tanh", "torch.logsumexp"} <= names
    assert {"transformers.LlamaRMSNorm", "transformers.NewGELUActivation"} <= names  # copied into programs, decorators off
    why = {e["name"]: e["why"] for e in excluded}
    assert why["nn.Dropout"].startswith("stochastic")
    assert why["F.relu_"].startswith("in place")
    assert "running statistics" in why["nn.BatchNorm2d"]
    assert "loss" in why["nn.MSELoss"]
    write_catalogue(tmp_path / "catalogue.json", ops, excluded)
    written = json.loads((tmp_path / "catalogue.json").read_text())
    assert len(written["kept"]) == len(ops) and len(written["excluded"]) == len(excluded)


def test_the_composer_is_deterministic_and_writes_tasks_the_loader_reads(catalogue):
    ops, _ = catalogue
    first = [compose(seed, ops) for seed in range(12)]
    again = [compose(seed, ops) for seed in range(12)]
    assert [c.source for c in first if c] == [c.source for c in again if c]
    lengths = {len(c.provenance["ops"]) for c in first if c}
    assert max(lengths) > 1 and all(1 <= n <= 5 for n in lengths)
    for candidate in filter(None, first):
        assert not static_problem(candidate.source), candidate.source
        assert parse_task(candidate.source, candidate.id).presets["cpp"]["batch_size"] == 1


def test_the_batch_is_sized_to_the_window_where_it_is_measured(catalogue):
    candidate = next(c for c in (compose(seed, catalogue[0]) for seed in range(40)) if c and c.provenance["layout"] == "flat")
    grown = sized(candidate, (1.0, 100.0))
    batch = grown.provenance["batch_cpp"]
    assert batch > 1
    presets = parse_task(grown.source, grown.id).presets
    assert presets["cpp"]["batch_size"] == batch and presets["cuda"]["batch_size"] > batch


@pytest.mark.parametrize("source, reason", [
    ("def broken(:\n", "does not parse"),
    (program().replace("def get_inputs", "def get_other"), "does not define get_inputs"),
    (program("torch.nn.functional.dropout(x, 0.5)"), "stochastic"),
    (program("x + torch.randn_like(x) * torch.rand(1)"), "stochastic"),
])
def test_each_static_filter_rejects_a_crafted_task_with_its_reason(source, reason):
    assert reason in static_problem(source)


@pytest.mark.parametrize("body, dims, reason", [
    ("x @ torch.ones(7, 7)", "4096", "eager run failed"),
    ("torch.log(-torch.abs(x) - 1.0)", "4096", "NaN or Inf"),
    ("x * 0.0 + 1.0", "4096", "output is constant"),
    ("x * 1e-9", "4096", "within tolerance of zero"),
    ("torch.ones_like(x).cumsum(-1)", "4096", "does not depend on the inputs"),
    ("torch.tanh(x)", "4", "outside [1.0, 100.0] ms"),
])
def test_each_dynamic_filter_rejects_a_crafted_task_with_its_reason(body, dims, reason):
    task = parse_task(program(body, dims), "synth/crafted")
    problem, _ = dynamic_problem(task, "cpp", (1.0, 100.0), try_compile=False)
    assert reason in problem, problem


def test_a_good_task_passes_every_filter_including_torch_compile():
    problem, eager_ms = dynamic_problem(parse_task(program(dims="65536"), "synth/good"), "cpp", (0.05, 1000.0), try_compile=True)
    assert problem == "" and eager_ms > 0


def test_duplicates_are_caught_exactly_and_near_duplicates_by_ast_similarity():
    base = program("torch.tanh(x) * 2.0")
    assert exact_key(base) == exact_key("# a comment\n" + base.replace("super().__init__()", "super().__init__()  # same"))
    index = SimilarityIndex(0.9)
    index.add("synth/a", base)
    assert index.similar(program("torch.tanh(x) * 3.0", dims="1024"))[1] == 1.0  # other constants: the same task
    assert index.similar(program("torch.sigmoid(torch.cumsum(x, dim=-1))")) is None


@pytest.mark.skipif(not (KERNELBENCH / "level1").is_dir(), reason="KernelBench is not in ../shared/kernelbench")
def test_a_kernelbench_problem_is_caught_as_contamination_with_its_name(tmp_path):
    kernelbench = kernelbench_index(KERNELBENCH, 0.9)
    relu = next((KERNELBENCH / "level1").glob("19_*.py"))
    run = SynthRun(tmp_path, 0.9, kernelbench)
    row = run.precheck(7, Candidate("synth/relu_copy", relu.read_text(), {"ops": ["relu"]}))
    assert row["stage"] == "contamination" and row["closest"] == f"level1/{relu.stem}", row


def test_a_run_records_every_candidate_and_resumes_without_redoing_them(tmp_path, catalogue):
    ops, _ = catalogue
    run = SynthRun(tmp_path, 0.9, None)
    good = next(c for c in (compose(seed, ops) for seed in range(5)) if c)
    seed = good.provenance["seed"]
    run.record(run.finish(seed, good, "", 5.0))
    twin = Candidate("synth/twin", good.source.replace("Synthesised", "Also synthesised"), {"ops": []})
    assert run.precheck(seed + 100, twin)["stage"] == "duplicate"
    run.record(run.finish(seed + 1, twin, "", 5.0))  # screened at the same time as the first: caught at the end
    assert run.counts()["accepted"] == 1 and run.counts()["duplicate"] == 1
    again = SynthRun(tmp_path, 0.9, None)
    assert again.accepted_count == 1 and {seed, seed + 1} <= again.seeds
    tasks, failures = load_tasks([tmp_path / "tasks"])
    assert [t.id for t in tasks] == [good.id] and not failures


def test_cuda_agent_synth_builds_a_task_folder_that_train_and_eval_read(tmp_path):
    from configs.load import load_config
    from launch.synth import run_synth

    cfg = load_config([], [f"synth.out_dir={tmp_path}", "synth.tasks=3", "synth.workers=1", "synth.try_compile=false",
                           "synth.window_ms_cpp=[0.2,200.0]"])
    report = run_synth(cfg, progress=False)
    assert report["stages"]["accepted"] == 3
    assert sum(report["stages"].values()) == report["candidates"] == len((tmp_path / "manifest.jsonl").read_text().splitlines())
    tasks, failures = load_tasks([tmp_path / "tasks"])
    assert len(tasks) == 3 and not failures
    resumed = run_synth(cfg, progress=False)
    assert resumed["candidates"] == report["candidates"], "a rerun at its target composes nothing new"


def test_a_task_set_in_the_ops_6k_parquet_layout_loads_as_tasks(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"op_name": ["tanh_scale", "broken"], "code": [program(), "class Model: pass\n"]})
    pq.write_table(table, tmp_path / "ops6k.parquet")
    tasks, failures = load_tasks([tmp_path])
    assert [t.id for t in tasks] == ["ops6k/tanh_scale"]
    assert len(failures) == 1 and "ops6k/broken" in failures[0].path and "get_inputs" in failures[0].reason
    pq.write_table(pa.table({"n": [1]}), tmp_path / "ops6k.parquet")
    assert "no column of programs" in load_tasks([tmp_path / "ops6k.parquet"])[1][0].reason


def test_a_policy_writes_candidates_that_go_through_the_same_filters(tmp_path, tiny_model_dir):
    from configs.load import load_config
    from launch.synth import run_synth

    script = tmp_path / "answers.json"
    script.write_text(json.dumps([f"Here it is:\n```python\n{program(dims='65536')}```",
                                  "I cannot write that program.",
                                  f"```python\n{program('torch.nn.functional.dropout(x, 0.1)')}```",
                                  f"```python\n{program('torch.tanh(x) * 5.0', dims='65536')}```"]))
    cfg = load_config([], [f"synth.out_dir={tmp_path / 'out'}", "synth.tasks=1", "synth.workers=0", "synth.max_candidates=4",
                           f"synth.policy=replay:{script}", f"model.path={tiny_model_dir}", "synth.try_compile=false",
                           "synth.window_ms_cpp=[0.01,1000.0]"])
    report = run_synth(cfg, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "out" / "manifest.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in rows] == ["accepted"], rows  # the target is one task: it stops there
    cfg.synth.tasks = 2
    report = run_synth(cfg, progress=False)
    stages = [json.loads(line)["stage"] for line in (tmp_path / "out" / "manifest.jsonl").read_text().splitlines()]
    # A new run asks the script from its start: the first answer again (a copy now), then the others.
    assert stages[1:] == ["near_duplicate", "compose", "static", "near_duplicate"], stages
    assert report["stages"]["accepted"] == 1


@pytest.mark.slow
def test_a_vllm_policy_composes_through_the_same_path(tmp_path, tiny_model_dir):
    from configs.load import load_config
    from launch.synth import run_synth

    cfg = load_config([], [f"synth.out_dir={tmp_path}", "synth.tasks=1", "synth.workers=0", "synth.max_candidates=4",
                           f"synth.policy=vllm:{tiny_model_dir}", f"model.path={tiny_model_dir}", "synth.max_new_tokens=64",
                           "synth.llm_concurrency=4"])
    report = run_synth(cfg, progress=False)  # a random model writes no program: every candidate is a compose row
    assert report["candidates"] == 4 and report["stages"]["compose"] + report["stages"]["static"] == 4, report


@pytest.mark.parametrize("override, named", [("synth.window_ms_cpp=[100.0,1.0]", "synth.window_ms_cpp"),
                                             ("synth.tasks=0", "synth.tasks"),
                                             ("synth.duplicate_similarity=1.5", "synth.duplicate_similarity")])
def test_bad_settings_are_refused_naming_the_field(tmp_path, override, named):
    from configs.load import ConfigError, load_config
    from launch.synth import run_synth

    with pytest.raises(ConfigError, match=named):
        run_synth(load_config([], [f"synth.out_dir={tmp_path}", override]), progress=False)
    assert not (tmp_path / "manifest.jsonl").exists()


def test_a_stopped_run_writes_its_report_too(tmp_path):
    """`cuda-agent jobs stop` interrupts a job's driver as Ctrl-C does (SIGINT): the report of what was done is written."""
    import os
    import signal
    import subprocess
    import sys
    import time

    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "launch.cli", "synth", f"synth.out_dir={out}", "synth.tasks=50",
                             "synth.workers=0", "synth.try_compile=false", "logging.progress=false"],
                            cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not (out / "manifest.jsonl").exists() or not (out / "manifest.jsonl").read_text().strip():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    said = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, said[-3000:]
    report = json.loads((out / "report.json").read_text())
    rows = (out / "manifest.jsonl").read_text().splitlines()
    assert report["finished"] is False and report["candidates"] == len(rows) >= 1, report
    assert "the counts in report.json" in said
