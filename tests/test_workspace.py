"""The agent's workspace: what it holds, and every rule a write must pass."""
from __future__ import annotations

import os

import pytest

from rollout.workspace import MAX_FILE_BYTES, MAX_FILES, Workspace, WorkspaceError, default_root
from tasks.task import Task

SOURCE = "import torch\nclass Model(torch.nn.Module):\n    pass\ndef get_inputs():\n    return []\ndef get_init_inputs():\n    return []\n"


@pytest.fixture
def task() -> Task:
    return Task(id="level1/99_probe", level=1, source=SOURCE)


@pytest.fixture
def ws(tmp_path, task) -> Workspace:
    return Workspace.create(tmp_path / "workspaces", "ep-1", task, "cpp", "# skill\n")


def test_new_workspace_holds_read_only_reference_and_skill(ws):
    assert ws.list_files() == [("SKILL.md", 8, False), ("reference.py", len(SOURCE), False)]
    assert ws.read("reference.py") == SOURCE and ws.read("./SKILL.md") == "# skill\n"
    assert not os.access(ws.path / "reference.py", os.W_OK) or os.geteuid() == 0  # root ignores modes
    assert ws.solution_files() == {}


def test_written_files_are_the_solution_and_notes_are_not(ws):
    ws.write("model_new.py", "class ModelNew: pass\n")
    ws.write("kernel.cpp", "extern \"C\" void f() {}\n")
    ws.write("tile.h", "#pragma once\n")
    ws.write("my_helpers.py", "X = 1\n")
    ws.write("notes.md", "plan: tile it\n")
    assert set(ws.solution_files()) == {"model_new.py", "kernel.cpp", "tile.h", "my_helpers.py"}
    assert ws.solution_files()["kernel.cpp"] == "extern \"C\" void f() {}\n"
    ws.write("./kernel.cpp", "// v2\n")  # overwrite, through a "./" name
    assert ws.read("kernel.cpp") == "// v2\n"


@pytest.mark.parametrize("name, rule", [
    ("reference.py", "read-only"),
    ("SKILL.md", "read-only"),
    ("../escape.py", "leaves the workspace"),
    ("sub/../../x.cpp", "leaves the workspace"),
    ("/etc/passwd", "absolute path"),
    ("~/x.py", "absolute path"),
    ("sub/kernel.cpp", "sub-folder"),
    ("a\\b.h", "sub-folder"),
    (".hidden.py", "not an allowed file name"),
    ("", "non-empty file name"),
    ("kernel.cu", "cuda backend's kernel source"),
    ("helper.cpp", "not a file this backend uses"),
    ("kernel.so", "not a file this backend uses"),
    ("torch.py", "shadow"),
    ("ctypes.py", "shadow"),
    ("my-helpers.py", "identifier"),
])
def test_write_refuses_with_the_rule_and_the_fix(ws, name, rule):
    with pytest.raises(WorkspaceError, match=rule):
        ws.write(name, "x")


def test_cuda_workspace_takes_kernel_cu_and_cuh_but_not_kernel_cpp(tmp_path, task):
    ws = Workspace.create(tmp_path, "ep-cuda", task, "cuda", "")
    ws.write("kernel.cu", "__global__ void k() {}\n")
    ws.write("tile.cuh", "#pragma once\n")
    with pytest.raises(WorkspaceError, match="compiles kernel.cu"):
        ws.write("kernel.cpp", "")


def test_symlinks_are_neither_read_nor_written(ws, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("seed=42")
    (ws.path / "kernel.h").symlink_to(secret)
    with pytest.raises(WorkspaceError, match="links"):
        ws.read("kernel.h")
    with pytest.raises(WorkspaceError, match="links"):
        ws.write("kernel.h", "overwritten")
    assert secret.read_text() == "seed=42"
    assert "kernel.h" not in ws.solution_files()


def test_oversize_files_and_too_many_files_are_refused(ws):
    with pytest.raises(WorkspaceError, match=f"limit is {MAX_FILE_BYTES}"):
        ws.write("kernel.cpp", "x" * (MAX_FILE_BYTES + 1))
    for i in range(MAX_FILES - 2):
        ws.write(f"h{i}.h", "")
    with pytest.raises(WorkspaceError, match="overwrite an existing file"):
        ws.write("one_more.h", "")
    ws.write("h0.h", "// still fine: an overwrite")


def test_reading_a_missing_file_lists_the_files(ws):
    with pytest.raises(WorkspaceError, match="the files are: SKILL.md, reference.py"):
        ws.read("model_new.py")


def test_create_replaces_an_old_workspace_and_remove_deletes_it(tmp_path, task):
    first = Workspace.create(tmp_path, "ep", task, "cpp", "")
    first.write("model_new.py", "old")
    second = Workspace.create(tmp_path, "ep", task, "cpp", "")
    assert "model_new.py" not in dict((n, s) for n, s, _ in second.list_files())
    second.remove()
    assert not second.path.exists()
    with pytest.raises(ValueError, match="episode_id"):
        Workspace.create(tmp_path, "../ep", task, "cpp", "")
    assert default_root("/x/env") == default_root("/x/env/").resolve() and str(default_root("/x/env")).endswith("env/workspaces")
