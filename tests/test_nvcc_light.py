"""env_pool/build/nvcc_light.py: a load_inline kernel file built lean, then as written, the first that builds kept.

Real nvcc on tiny files. The build's include path has a small stand-in torch/ (types.h and an
extension.h that defines FULL_ONLY), so the lean build finds the light extension.h and the
stand-in types.h, and the full build the stand-in extension.h: a file that checks FULL_ONLY
builds only as written. Where the stand-in also has ATen/Functions.h (two operators, each
defining HAVE_<NAME>), the lean build's Functions.h includes only the operators the file names.
torch's own headers are exercised on the GPU (the corpus's legit/gelu_load_inline_cuda,
scripts/bench_inline_build.py).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from env_pool.build import nvcc_light

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="needs nvcc")


def real_home() -> Path:
    return Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda").resolve()


@pytest.fixture(params=["1", "0"], ids=["at-once", "one-after-another"])
def build(tmp_path, request, monkeypatch):
    """A build folder with the stand-in torch headers and a view of the toolkit, as the import child gets it;
    the builds run at once (as with many CPUs) and one after another (as with few)."""
    monkeypatch.setenv(nvcc_light.AT_ONCE_ENV, request.param)
    (tmp_path / "inc" / "torch").mkdir(parents=True)
    (tmp_path / "inc" / "torch" / "types.h").write_text("#pragma once\n#define STAND_IN_TYPES 1\n")
    (tmp_path / "inc" / "torch" / "extension.h").write_text("#pragma once\n#include <torch/types.h>\n#define FULL_ONLY 1\n")
    view = nvcc_light.install(str(real_home()), tmp_path / "view")
    return tmp_path, view


def compile_cu(folder: Path, view: Path, source: str) -> subprocess.CompletedProcess:
    (folder / "cuda.cu").write_text(source)
    # torch's ninja rule for a .cu file, in small
    cmd = [str(view / "bin" / "nvcc"), "--generate-dependencies-with-compile", "--dependency-output", "cuda.cuda.o.d",
           f"-I{folder / 'inc'}", "-c", str(folder / "cuda.cu"), "-o", "cuda.cuda.o"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # a build's environment need not name our package
    return subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=300)


KERNEL = "__global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n"


def leftovers(folder: Path) -> list[str]:
    """What the faster builds left in the build's folder (their objects, scratch, lean headers): nothing."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("cuda.cuda.o.") and p.name != "cuda.cuda.o.d")


def with_operators(folder: Path) -> None:
    """A stand-in ATen/Functions.h that includes two operators' headers, as torch's includes all of them."""
    (folder / "inc" / "ATen" / "ops").mkdir(parents=True)
    (folder / "inc" / "ATen" / "Functions.h").write_text("#pragma once\n#include <ATen/ops/relu.h>\n#include <ATen/ops/softmax.h>\n")
    for op in ("relu", "softmax"):
        (folder / "inc" / "ATen" / "ops" / f"{op}.h").write_text(f"#pragma once\n#define HAVE_{op.upper()} 1\n")


def test_a_file_that_builds_light_keeps_the_light_object(build):
    folder, view = build
    done = compile_cu(folder, view, "#include <torch/extension.h>\n#ifndef STAND_IN_TYPES\n#error no types\n#endif\n" + KERNEL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (folder / "cuda.cuda.o").is_file() and leftovers(folder) == [], "the light object became the build's"
    deps = (folder / "cuda.cuda.o.d").read_text()
    assert deps.split(":")[0].strip() == "cuda.cuda.o", deps[:200]
    assert "light_headers/torch/extension.h" in deps and "inc/torch/extension.h" not in deps, "built against the light header"


def test_a_file_that_needs_the_whole_header_is_built_as_written(build):
    folder, view = build
    done = compile_cu(folder, view, "#include <torch/extension.h>\n#ifndef FULL_ONLY\n#error needs the whole header\n#endif\n" + KERNEL)
    assert done.returncode == 0, done.stdout + done.stderr
    deps = (folder / "cuda.cuda.o.d").read_text()
    assert "inc/torch/extension.h" in deps and "light_headers" not in deps
    assert leftovers(folder) == []


def test_an_error_is_reported_from_the_build_as_written(build):
    folder, view = build
    done = compile_cu(folder, view, "#include <torch/extension.h>\n#ifdef FULL_ONLY\n#error the full header's own error\n#endif\n"
                                    "#ifndef FULL_ONLY\nint broken(\n#endif\n" + KERNEL)
    assert done.returncode != 0
    assert "the full header's own error" in done.stdout + done.stderr
    assert "broken" not in done.stdout + done.stderr, "the lean build's messages are not the agent's to read"


def test_other_nvcc_calls_pass_straight_through(build):
    _, view = build
    done = subprocess.run([str(view / "bin" / "nvcc"), "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Cuda compilation tools" in done.stdout
    assert (view / "include").resolve() == (real_home() / "include").resolve()


def test_a_file_builds_lean_with_only_the_operators_it_names(build):
    folder, view = build
    with_operators(folder)
    done = compile_cu(folder, view, "#include <torch/extension.h>\n#include <ATen/Functions.h>\n"
                                    "#ifndef HAVE_RELU\n#error relu is named here\n#endif\n"
                                    "#ifdef HAVE_SOFTMAX\n#error not named here: the lean header leaves it out\n#endif\n" + KERNEL)
    assert done.returncode == 0, done.stdout + done.stderr
    deps = (folder / "cuda.cuda.o.d").read_text()
    assert deps.split(":")[0].strip() == "cuda.cuda.o" and "cuda.cuda.o.lean-headers/ATen/Functions.h" in deps, deps[:400]
    assert leftovers(folder) == []


def test_a_file_that_calls_an_operator_it_does_not_name_is_built_as_written(build):
    folder, view = build
    with_operators(folder)
    done = compile_cu(folder, view, "#include <torch/extension.h>\n#include <ATen/Functions.h>\n"
                                    "#ifndef HAVE_SOFTMAX\n#error a macro that calls it, say\n#endif\n" + KERNEL)
    assert done.returncode == 0, done.stdout + done.stderr
    deps = (folder / "cuda.cuda.o.d").read_text()
    assert "inc/ATen/Functions.h" in deps and "inc/torch/extension.h" in deps
    assert "light_headers" not in deps and "lean-headers" not in deps
    assert leftovers(folder) == []
