"""Task loading: the starter set, KernelBench-format files from anywhere, and broken files with reasons."""
from __future__ import annotations

import textwrap
from pathlib import Path

import msgpack
import pytest
import torch

from tasks.describe import describe_task
from tasks.loader import load_task_file, load_tasks
from tasks.screen import screen_task
from tasks.task import Task, build_problem

GOOD = textwrap.dedent(
    """
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, scale):
            super().__init__()
            self.scale = scale

        def forward(self, x):
            return torch.tanh(x) * self.scale

    N = 4096
    PRESETS = {"cpp": {"N": 64}}

    def get_inputs():
        return [torch.randn(N, 256)]

    def get_init_inputs():
        return [2.0]
    """
)


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_starter_set_has_at_least_24_tasks_across_three_levels():
    tasks, failures = load_tasks()
    assert not failures, f"starter tasks failed to load: {failures}"
    assert len(tasks) >= 24
    levels = {t.level for t in tasks}
    assert levels == {1, 2, 3}, f"levels present: {levels}"


def test_a_kernelbench_folder_loads_with_levels_from_folder_names(tmp_path: Path):
    write(tmp_path, "level2/1_tanh_scale.py", GOOD)
    write(tmp_path, "misc/2_other.py", GOOD)
    tasks, failures = load_tasks([tmp_path])
    assert not failures
    by_id = {t.id: t for t in tasks}
    assert by_id["level2/1_tanh_scale"].level == 2
    assert by_id["misc/2_other"].level == 0


def test_presets_change_the_inputs_per_backend(tmp_path: Path):
    task = load_task_file(write(tmp_path, "p.py", GOOD))
    assert describe_task(task, "cpp").inputs == ["float32[64, 256]"]
    assert describe_task(task, "cuda").inputs == ["float32[4096, 256]"]
    assert describe_task(task, "cpp").init_inputs == ["float: 2.0"]


@pytest.mark.parametrize(
    "text, reason",
    [
        ("def get_inputs(:\n", "syntax error at line 1"),
        ("import torch\ndef get_inputs(): return []\ndef get_init_inputs(): return []\n", "missing Model"),
        (GOOD.replace("nn.Module", "object"), "subclass of torch.nn.Module"),
        (GOOD.replace("import torch.nn as nn", "import torch.nn as nn\nimport no_such_module"), "No module named"),
        (GOOD.replace("torch.randn(N, 256)", "torch.randn(N, 256, undefined)"), "building the inputs failed"),
        (GOOD.replace("self.scale = scale", "self.scale = scale / 0 if False else undefined_name"), "building the model failed"),
        (GOOD.replace('PRESETS = {"cpp": {"N": 64}}', 'PRESETS = {"opencl": {"N": 64}}'), "unknown backend"),
        (GOOD.replace('PRESETS = {"cpp": {"N": 64}}', "PRESETS = make_presets()"), "must be a literal"),
    ],
)
def test_broken_files_are_reported_with_the_reason(tmp_path: Path, text: str, reason: str):
    write(tmp_path, "ok.py", GOOD)
    write(tmp_path, "broken.py", text)
    tasks, failures = load_tasks([tmp_path])
    assert [t.id for t in tasks] == ["ok"], "a broken file must not hide the good ones"
    assert len(failures) == 1 and failures[0].path.endswith("broken.py")
    assert reason in failures[0].reason, failures[0].reason


def test_a_model_whose_constructor_reads_a_value_loads(tmp_path: Path):
    # Swin's constructors call .item() on a drop-path schedule, which the meta device cannot run.
    reads = GOOD.replace("self.scale = scale", "self.scale = float(torch.linspace(0, scale, 3)[1].item())")
    tasks, failures = load_tasks([write(tmp_path, "reads.py", reads)])
    assert not failures and [t.id for t in tasks] == ["reads"]


KERNELBENCH = Path(__file__).resolve().parents[2] / "shared" / "kernelbench"


@pytest.mark.skipif(not KERNELBENCH.is_dir(), reason="../shared/kernelbench is not here")
def test_every_kernelbench_problem_loads():
    tasks, failures = load_tasks([KERNELBENCH / f"level{n}" for n in (1, 2, 3)])
    assert not failures, [f"{f.path}: {f.reason}" for f in failures]
    assert len(tasks) == 250


def test_missing_path_is_a_failure_not_an_exception(tmp_path: Path):
    tasks, failures = load_tasks([tmp_path / "nope"])
    assert tasks == [] and failures[0].reason == "no such file or folder"


def test_task_round_trips_through_msgpack(tmp_path: Path):
    task = load_task_file(write(tmp_path, "p.py", GOOD))
    again = Task.from_dict(msgpack.unpackb(msgpack.packb(task.to_dict())))
    assert again == task


def test_tolerances_follow_dtype_unless_the_file_overrides(tmp_path: Path):
    task = load_task_file(write(tmp_path, "p.py", GOOD))
    assert task.tolerances("bfloat16") == (2e-2, 2e-2)
    loose = load_task_file(write(tmp_path, "q.py", GOOD + '\nTOLERANCE = {"atol": 0.5}\n'))
    assert loose.tolerances("float32") == (0.5, 1e-4)


def test_reference_of_a_built_problem_runs_on_cpu(tmp_path: Path):
    problem = build_problem(load_task_file(write(tmp_path, "p.py", GOOD)), "cpp")
    model = problem.model_cls(*problem.get_init_inputs())
    (x,) = problem.get_inputs()
    torch.testing.assert_close(model(x), torch.tanh(x) * 2.0)


def test_screen_flags_a_constant_output(tmp_path: Path):
    constant = GOOD.replace("return torch.tanh(x) * self.scale", "return torch.zeros_like(x)")
    result = screen_task(load_task_file(write(tmp_path, "c.py", constant)), window_ms=(0.0, 1e9))
    assert any("output is constant" in p for p in result.problems), result.problems


def test_screen_flags_a_nondeterministic_output(tmp_path: Path):
    noisy = GOOD.replace("return torch.tanh(x) * self.scale", "return x + torch.rand_like(x)")
    result = screen_task(load_task_file(write(tmp_path, "n.py", noisy)), window_ms=(0.0, 1e9))
    assert any("not deterministic" in p for p in result.problems)


def test_screen_takes_run_to_run_noise_inside_the_tolerance_as_deterministic(tmp_path: Path):
    # What a GPU's atomics do to a sum: each run differs in the last bits, never beyond the tolerance.
    jitter = GOOD.replace("return torch.tanh(x) * self.scale", "return torch.tanh(x) * self.scale + 1e-6 * torch.rand(())")
    result = screen_task(load_task_file(write(tmp_path, "j.py", jitter)), window_ms=(0.0, 1e9))
    assert not any("not deterministic" in p for p in result.problems), result.problems


def test_screen_flags_an_output_that_ignores_the_inputs(tmp_path: Path):
    ignores = GOOD.replace("return torch.tanh(x) * self.scale", "return torch.arange(8.0)")
    result = screen_task(load_task_file(write(tmp_path, "i.py", ignores)), window_ms=(0.0, 1e9))
    assert "output does not depend on the inputs" in result.problems


def test_every_starter_reference_runs_on_cpu_within_the_window():
    torch.set_num_threads(1)
    tasks, _ = load_tasks()
    # The window is the starter set's contract (1-50 ms on one core), widened for a loaded CI machine.
    bad = {r.task_id: r.problems for t in tasks if not (r := screen_task(t, "cpp", window_ms=(0.3, 150.0))).ok}
    assert not bad, f"starter references that are not usable benchmarks: {bad}"
