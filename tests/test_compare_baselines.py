"""scripts/compare_baselines.py: our baselines against KernelBench's published ones, with a likely
cause for each problem outside the 0.8-1.25 band (synthetic records in both formats)."""
from __future__ import annotations

import json
from pathlib import Path

from scripts import compare_baselines
from scripts.kernelbench_baselines import COMPILE_FOOTPRINT, facts, split_by_footprint
from tasks.task import Task

PUBLISHED = {  # KernelBench's layout: level -> problem file -> stats
    "level1": {"1_Matmul.py": {"mean": 2.0}, "33_BatchNorm.py": {"mean": 1.0}, "50_conv.py": {"mean": 2.0},
               "9_Tiny.py": {"mean": 0.03}, "22_Tanh.py": {"mean": 4.0}, "40_Norm.py": {"mean": 8.0}},
    "level2": {"5_Gemm_ReLU.py": {"mean": 1.0}},
}


def write_published(folder: Path) -> Path:
    folder.mkdir()
    for name in compare_baselines.FILES.values():
        (folder / name).write_text(json.dumps(PUBLISHED))
    return folder


def test_each_problem_gets_its_ratio_and_each_outlier_a_likely_cause(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    records = [  # kernelbench_baselines.py's lines: task id without its level, facts beside the times
        {"task_id": "1_Matmul", "level": 1, "eager_ms": 2.1, "compiled_ms": 2.0, "input_mb": 192.0},
        {"task_id": "33_BatchNorm", "level": 1, "eager_ms": 0.4, "compiled_ms": 0.5, "train_mode_modules": ["BatchNorm"]},
        {"task_id": "50_conv", "level": 1, "eager_ms": 6.0, "compiled_ms": 6.0, "convolutions": ["Conv2d"], "input_mb": 147.0},
        {"task_id": "9_Tiny", "level": 1, "eager_ms": 0.09, "compiled_ms": 0.09, "input_mb": 900.0},
        {"task_id": "22_Tanh", "level": 1, "eager_ms": 9.0, "compiled_ms": 9.0, "input_mb": 6144.0},
        {"task_id": "40_Norm", "level": 1, "error": "out of memory", "input_mb": 256.0},  # no baseline: not compared
        {"task_id": "40_Norm", "level": 1, "eager_ms": 8.0, "compiled_ms": 8.0, "input_mb": 256.0},  # its retry
    ]
    (run / "baselines-gpu0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"task_id": "torn')
    # a sweep's results.jsonl in the other RUN_DIR format: the task id carries its folder
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "results.jsonl").write_text(json.dumps({"task_id": "kb/level2/5_Gemm_ReLU", "level": 2, "eager_ms": 3.0,
                                                     "compiled_ms": 1.0, "input_mb": 16.0}) + "\n")
    out = tmp_path / "out"
    compare_baselines.main([str(run), str(sweep), "--out", str(out), "--timing", str(write_published(tmp_path / "kb"))])

    report = json.loads((out / "baselines.json").read_text())
    rows = {r["task"]: r for r in report["problems"]}
    assert set(rows) == {"level1/1_Matmul", "level1/33_BatchNorm", "level1/50_conv", "level1/9_Tiny", "level1/22_Tanh",
                         "level1/40_Norm", "level2/5_Gemm_ReLU"}
    assert abs(rows["level1/1_Matmul"]["eager_ratio"] - 1.05) < 1e-9 and rows["level1/1_Matmul"]["likely_cause"] == ""
    assert rows["level1/40_Norm"]["likely_cause"] == ""
    assert rows["level1/33_BatchNorm"]["likely_cause"].startswith("likely train vs eval mode (BatchNorm")
    assert rows["level1/50_conv"]["likely_cause"].startswith("likely TF32 (Conv2d")
    assert rows["level1/9_Tiny"]["likely_cause"].startswith("likely launch-bound")
    assert rows["level1/22_Tanh"]["likely_cause"] == "not explained by the known causes"
    assert rows["level2/5_Gemm_ReLU"]["likely_cause"].startswith("likely cold caches")
    levels = {r["level"]: r for r in report["levels"]}
    assert levels["all"]["problems"] == 7 and levels["level2"]["problems"] == 1
    assert "| level1/50_conv |" in (out / "baselines.md").read_text()


def test_the_facts_name_convolutions_and_modules_whose_train_mode_differs():
    source = ("import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    def __init__(self):\n"
              "        super().__init__()\n        self.c = nn.ConvTranspose2d(3, 8, 3)\n        self.b = nn.BatchNorm2d(8)\n"
              "    def forward(self, x):\n        return self.b(self.c(x))\n"
              "def get_inputs():\n    return [torch.randn(2, 3, 16, 16)]\ndef get_init_inputs():\n    return []\n")
    record = facts(Task(id="level2/1_t", level=2, source=source), "cuda")
    assert record["train_mode_modules"] == ["BatchNorm"] and record["convolutions"] == ["ConvTranspose2d"]
    assert abs(record["input_mb"] - 2 * 3 * 16 * 16 * 4 / 2**20) < 0.01


def test_compiles_ahead_split_by_their_inputs_footprint_and_an_unreadable_size_counts_as_large():
    def task(name: str, inputs: str) -> Task:
        source = ("import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x):\n        return x\n"
                  f"def get_inputs():\n    return {inputs}\ndef get_init_inputs():\n    return []\n")
        return Task(id=f"level1/{name}", level=1, source=source)

    one_mb = "[torch.randn(512, 512)]"  # 1 MB of float32
    tasks = [task("small", one_mb), task("large", "[torch.randn(512, 512, 8)]"),
             task("unreadable", "[torch.randn(int(torch.randn(1).item()) + 4, 4)]")]  # .item() on the meta device fails
    small, large = split_by_footprint(tasks, "cuda", share_mb=COMPILE_FOOTPRINT * 1.0)
    assert [t.id for t in small] == ["level1/small"]
    assert [t.id for t in large] == ["level1/large", "level1/unreadable"]
    assert split_by_footprint(tasks[:2], "cuda", share_mb=float("inf"))[1] == []


def test_a_sweeps_results_get_their_facts_from_the_problems_sources(tmp_path: Path):
    """A sweep's results.jsonl records no facts: --tasks reads them from the problems, so a convolution's ratio is explained."""
    folder = tmp_path / "level1"
    folder.mkdir()
    (folder / "50_conv.py").write_text(
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.conv = nn.Conv2d(3, 8, 3)\n"
        "    def forward(self, x):\n        return self.conv(x)\n\n"
        "def get_inputs():\n    return [torch.randn(2, 3, 32, 32)]\n\ndef get_init_inputs():\n    return []\n")
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "results.jsonl").write_text(json.dumps({"task_id": "50_conv", "level": 1, "eager_ms": 6.0, "compiled_ms": 6.0}) + "\n")
    timing = write_published(tmp_path / "kb")
    for extra, cause in (([], "not explained"), (["--tasks", str(folder)], "likely TF32 (Conv2d")):
        out = tmp_path / f"out{len(extra)}"
        compare_baselines.main([str(sweep), "--out", str(out), "--timing", str(timing), *extra])
        [row] = json.loads((out / "baselines.json").read_text())["problems"]
        assert row["likely_cause"].startswith(cause), row


def test_only_the_compiled_time_differing_points_at_inductors_version():
    ours = {"level1/89_cumsum": {"eager": 4.76, "compile": 3.29, "input_mb": 512.0, "convolutions": [], "train_mode_modules": []}}
    published = {"eager": {"level1/89_cumsum": 4.68}, "compile": {"level1/89_cumsum": 4.7}}
    [row] = compare_baselines.compare(ours, published)
    assert row["likely_cause"].startswith("likely torch.compile's version: eager agrees"), row
