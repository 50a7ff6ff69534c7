"""env_pool/build/nvcc_split.py: nvcc's host and device chains side by side, with nvcc's own plan (--dryrun) and tools.

Real nvcc on a tiny kernel file (no GPU needed to compile). That the object also loads and
runs is shown on the GPU, where load_inline's kernel files are built this way (the corpus's
legit/gelu_load_inline_cuda).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from env_pool.build import nvcc_split

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="needs nvcc")
SOURCE = """
__global__ void scale(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2.0f; }
template <typename T> __global__ void bump(T* x) { x[0] += T(1); }
void launch(float* x, int n) { scale<<<(n + 255) / 256, 256>>>(x, n); bump<float><<<1, 1>>>(x); }
"""
ARCH = ["-gencode=arch=compute_90,code=sm_90"]


def split(folder: Path, *args: str) -> subprocess.CompletedProcess:
    (folder / "scratch").mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-P", nvcc_split.__file__, str(folder / "scratch"), NVCC, *args],
                          cwd=folder, capture_output=True, text=True, timeout=300)


def symbols(obj: Path) -> list[str]:
    return sorted(subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout.splitlines())


@needs_nvcc
def test_a_split_build_has_nvccs_symbols_and_dependency_file(tmp_path):
    (tmp_path / "k.cu").write_text(SOURCE)
    done = split(tmp_path, "--generate-dependencies-with-compile", "--dependency-output", "k.o.d", "-c", "k.cu", "-o", "k.o", *ARCH)
    assert done.returncode == 0, done.stdout + done.stderr
    subprocess.run([NVCC, "-c", "k.cu", "-o", "ref.o", *ARCH], cwd=tmp_path, check=True)
    assert symbols(tmp_path / "k.o") == symbols(tmp_path / "ref.o")
    deps = (tmp_path / "k.o.d").read_text()
    assert deps.split(":")[0].strip() == "k.o" and "k.cu" in deps and "cuda_runtime.h" in deps


@needs_nvcc
def test_the_plan_puts_cudafe_and_cicc_in_separate_chains_sharing_a_written_module_id(tmp_path):
    (tmp_path / "k.cu").write_text(SOURCE)
    dry = subprocess.run([NVCC, "-c", "k.cu", "-o", "k.o", *ARCH, "--dryrun"], cwd=tmp_path, capture_output=True, text=True,
                         env={"PATH": str(Path(NVCC).parent) + ":/usr/bin:/bin", "TMPDIR": str(tmp_path)})
    plan = nvcc_split.parse(dry.stdout + dry.stderr, {})
    assert plan is not None, dry.stderr
    chains = {name: [nvcc_split.tool(plan.steps[i]) for i in indices] for name, indices in (("host", plan.host), ("device", plan.device))}
    assert chains["host"][-1] == "cudafe++" and "cicc" in chains["device"] and "ptxas" in chains["device"], chains
    assert plan.final == len(plan.steps) - 1 and "-c" in plan.steps[plan.final].split()
    nvcc_split.prepare(plan, "k.cu", "k.o")
    assert "--gen_module_id_file" not in plan.steps[plan.host[-1]]
    assert Path(plan.module_id).read_text().endswith("_4_k_cu")


def test_a_plan_of_unknown_shape_is_not_split():
    listing = "#$ gcc -E -x c++ k.cu -o a.ii\n#$ mystery-tool a.ii\n#$ gcc -c a.ii -o k.o\n"
    assert nvcc_split.parse(listing, {}) is None


@needs_nvcc
def test_a_compile_error_fails_with_the_compilers_message(tmp_path):
    (tmp_path / "k.cu").write_text(SOURCE + "void broken() { undeclared_name_here(); }\n")
    done = split(tmp_path, "-c", "k.cu", "-o", "k.o", *ARCH)
    assert done.returncode != 0 and "undeclared_name_here" in done.stdout + done.stderr
    assert not (tmp_path / "k.o").exists()


def test_the_h100_hosts_plan_has_the_known_shape():
    # `nvcc --dryrun` of a load_inline kernel file on the H100 machine (CUDA 13.0, gcc 13.3, sm_90a, a dependency file).
    listing = (Path(__file__).parent / "data" / "nvcc_dryrun_h100.txt").read_text()
    plan = nvcc_split.parse(listing, {})
    assert plan is not None
    assert [nvcc_split.tool(plan.steps[i]) for i in plan.host] == ["gcc", "cudafe++"]
    assert [nvcc_split.tool(plan.steps[i]) for i in plan.device] == ["gcc", "cicc", "ptxas", "fatbinary", "rm"]
    assert plan.deps_out == "cuda.cuda.o.d" and plan.env["CICC_PATH"].endswith("nvvm/bin")
