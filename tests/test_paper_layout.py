"""The CUDA Agent paper's workspace layout, read unchanged (issue 34, part 4).

The corpus holds a solution of our own in that layout (tests/env_corpus/legit/swish_paper_layout,
slow: the torch headers' build); here are its parts, and the released example itself when a
checkout of the paper's repository is named by CUDA_AGENT_PAPER_REPO (a GPU test).
"""
from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest
import torch.utils.cpp_extension as cpp_extension

from env_pool.build import paper_layout
from env_pool.evaluate import write_candidate
from env_pool.pool import EnvPool
from tasks.loader import load_task_file
from tasks.solution import (EXTENSION_MODULE, FIXED_FILES, extension_sources, read_solution, solution_file_name_ok,
                            uses_extension_module)
from tests.corpus_cases import CORPUS

CASE = CORPUS / "legit" / "swish_paper_layout"


def test_a_solution_folder_is_read_with_its_kernels_folder():
    files = read_solution(CASE)
    assert {"model_new.py", "kernels/swish.cpp", "kernels/swish_binding.cpp", *FIXED_FILES} <= set(files)
    assert uses_extension_module(files)
    assert not uses_extension_module({"model_new.py": "# import cuda_extension\nimport torch\n"})
    assert uses_extension_module({"model_new.py": "from cuda_extension import axpby_forward\n"})


def test_the_build_takes_what_the_papers_compile_script_takes():
    names = ["model_new.py", "a.cu", "b.cpp", "notes.md", "kernels/k.cu", "kernels/k_binding.cpp", "kernels/k.cuh",
             "kernels/deep/x.cu", "other/y.cu", "kernels/.hidden.cu"]
    assert extension_sources(names) == ["a.cu", "b.cpp", "kernels/k.cu", "kernels/k_binding.cpp"]
    assert not solution_file_name_ok("../escape.cu") and not solution_file_name_ok("kernels/../x.cu")
    assert solution_file_name_ok("kernels/k.cuh") and not solution_file_name_ok("kernels/notes.md")


def test_the_fixed_files_are_the_environments_never_the_candidates(tmp_path: Path):
    files = read_solution(CASE)
    write_candidate(tmp_path, files)
    for name in FIXED_FILES:
        assert (tmp_path / name).read_text() == paper_layout.FIXED_TEXT[name] != files[name]
    assert (tmp_path / "kernels" / "swish_binding.cpp").read_text() == files["kernels/swish_binding.cpp"]
    # A solution of the kernel.cpp layout keeps a file of that name as its own.
    other = tmp_path / "other"
    other.mkdir()
    write_candidate(other, {"model_new.py": "import torch\n", "binding_registry.h": "// mine\n"})
    assert (other / "binding_registry.h").read_text() == "// mine\n"


def test_the_registry_header_has_the_released_interface(tmp_path: Path):
    """A binding written to the released header's interface compiles against ours (pybind11 only: seconds)."""
    (tmp_path / "binding_registry.h").write_text(paper_layout.REGISTRY_HEADER)
    (tmp_path / "binding.cpp").write_text(paper_layout.BINDING_CPP)
    (tmp_path / "k_binding.cpp").write_text(
        '#include "binding_registry.h"\n'
        "static int twice(int x) { return 2 * x; }\n"
        'static void register_twice(pybind11::module& m) { m.def("twice", &twice, py::arg("x")); }\n'
        "REGISTER_BINDING(twice, register_twice);\n")
    includes = [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{sysconfig_include()}"]
    for source in ("binding.cpp", "k_binding.cpp"):
        done = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", *includes, source], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    assert f"PYBIND11_MODULE({EXTENSION_MODULE}," in paper_layout.BINDING_CPP


def sysconfig_include() -> str:
    import sysconfig

    return sysconfig.get_paths()["include"]


@pytest.mark.gpu
def test_the_released_example_scores_unchanged(tmp_path: Path):
    """The paper's own axpby example (its model.py as the task), given a checkout of its repository."""
    repo = os.environ.get("CUDA_AGENT_PAPER_REPO")
    if not repo:
        pytest.skip("set CUDA_AGENT_PAPER_REPO to a checkout of the CUDA Agent repository (its agent_workdir/)")
    workdir = Path(repo) / "agent_workdir"
    task = load_task_file(workdir / "model.py")
    files = {name: text for name, text in read_solution(workdir).items() if name != "model.py"}
    pool = EnvPool({"work_dir": str(tmp_path), "backend": "cuda", "rules": "paper", "pch_dir": ""})
    result = asyncio.run(pool.evaluate(task, files, "full"))
    assert result.failure is None and int(result.milestone) >= 1, (result.failure, result.message, result.compile_log)
