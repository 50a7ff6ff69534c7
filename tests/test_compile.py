"""env_pool.build.compile with the real g++ and nvcc: no mocks."""
from __future__ import annotations

import ctypes
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

import env_pool.build.compile as compile_module
from env_pool.build.compile import (
    COMPILE_ISOLATION,
    CPP_FLAGS,
    CompileResult,
    _run_compiler,
    cache_key,
    compile_kernel,
    compiler_env,
    kernel_files,
    summarize_compiler_errors,
    toolchain_view,
)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: cannot compile-check CUDA")
REPO = Path(__file__).resolve().parents[1]

ADD_CPP = """\
#include <cstdint>
#include "scale.h"

extern "C" void add(const float* a, const float* b, float* out, int64_t n) {
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + SCALE * b[i];
}
"""
SCALE_H = "#pragma once\nconstexpr float SCALE = 2.0f;\n"
ADD_CU = """\
#include <cstdint>

__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

extern "C" void add(const float* a, const float* b, float* out, int64_t n) {
  add_kernel<<<(n + 255) / 256, 256>>>(a, b, out, n);
}
"""


def _good() -> dict[str, str]:
    return {"kernel.cpp": ADD_CPP, "scale.h": SCALE_H}


def _ptr(array: np.ndarray):
    return array.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


def test_good_cpp_kernel_loads_and_computes(tmp_path: Path) -> None:
    result = compile_kernel(_good(), "cpp", tmp_path)
    assert result.ok, result.log
    assert not result.cache_hit and not result.infra
    assert Path(result.library).parent == tmp_path
    lib = ctypes.CDLL(result.library)
    lib.add.argtypes = [ctypes.POINTER(ctypes.c_float)] * 3 + [ctypes.c_int64]
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(10_001, dtype=np.float32), rng.standard_normal(10_001, dtype=np.float32)
    out = np.zeros_like(a)
    lib.add(_ptr(a), _ptr(b), _ptr(out), a.size)
    np.testing.assert_allclose(out, a + 2.0 * b, rtol=1e-6)
    print(f"\ncold g++ compile of a small kernel: {result.seconds:.2f} s")


def test_second_compile_is_a_fast_cache_hit(tmp_path: Path) -> None:
    first = compile_kernel(_good(), "cpp", tmp_path)
    second = compile_kernel(dict(reversed(list(_good().items()))), "cpp", tmp_path)  # order must not matter
    assert first.ok and second.ok
    assert second.cache_hit and second.key == first.key and second.library == first.library
    assert second.seconds < 0.05
    print(f"\ncache miss {first.seconds:.3f} s, cache hit {second.seconds * 1e3:.2f} ms")


def test_syntax_error_is_short_and_located(tmp_path: Path) -> None:
    broken = ADD_CPP.replace("a[i] + SCALE * b[i];", "a[i] + SCALE * b[i]\n  int y = 1;")
    result = compile_kernel({"kernel.cpp": broken, "scale.h": SCALE_H}, "cpp", tmp_path)
    assert not result.ok and result.library is None and not result.infra
    assert "kernel.cpp:6:" in result.log and "error" in result.log
    assert "|" in result.log  # the source line the compiler quoted
    assert tempfile.gettempdir() + "/" not in result.log and "cuda-agent-compile-" not in result.log
    assert len(result.log.splitlines()) < 30
    again = compile_kernel({"kernel.cpp": broken, "scale.h": SCALE_H}, "cpp", tmp_path)
    assert again.cache_hit and not again.ok and again.log == result.log  # failures are cached too


def test_undefined_symbol_fails_at_link_time_readably(tmp_path: Path) -> None:
    source = 'extern "C" float missing_helper(float);\nextern "C" float f(float x) { return missing_helper(x); }\n'
    result = compile_kernel({"kernel.cpp": source}, "cpp", tmp_path)
    assert not result.ok
    assert "undefined reference to `missing_helper'" in result.log
    assert "/tmp/" not in result.log and "collect2" not in result.log


def test_missing_source_names_the_expected_file(tmp_path: Path) -> None:
    result = compile_kernel({"scale.h": SCALE_H}, "cpp", tmp_path)
    assert not result.ok and "kernel.cpp" in result.log
    result = compile_kernel({"kernel.cpp": ADD_CPP}, "cuda", tmp_path, arch="sm_90a")
    assert not result.ok and "kernel.cu" in result.log


@pytest.mark.parametrize(
    "name", ["../kernel.cpp", "sub/x.h", "/etc/x.h", "..h", "a/../b.h", "-o.h", "../../model_new.py", "/tmp/x.py", "a\\b.py"]
)
def test_unsafe_names_are_rejected(tmp_path: Path, name: str) -> None:
    result = compile_kernel({"kernel.cpp": ADD_CPP, name: "int x;"}, "cpp", tmp_path)
    assert not result.ok and not result.infra and "rejected file" in result.log and repr(name) in result.log
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing cached


@pytest.mark.parametrize("name", ["helper.cc", "kernel.cu", "prebuilt.o", "libx.so", "k.ptx", "other.cpp"])
def test_other_compiler_inputs_are_rejected(tmp_path: Path, name: str) -> None:
    result = compile_kernel({**_good(), name: "int x;"}, "cpp", tmp_path)
    assert not result.ok and "rejected file" in result.log and "kernel.cpp" in result.log


def test_python_and_notes_are_not_compiled_nor_keyed(tmp_path: Path) -> None:
    solution = {**_good(), "model_new.py": "import ctypes\n", "NOTES.md": "try tiling", "notes/plan.txt": "x"}
    assert kernel_files(solution) == _good()
    result = compile_kernel(solution, "cpp", tmp_path)
    assert result.ok, result.log
    assert compile_kernel(_good(), "cpp", tmp_path).key == result.key


def test_cache_key_follows_source_flags_and_arch() -> None:
    base = cache_key(_good(), "cpp", CPP_FLAGS)
    assert base == cache_key(_good(), "cpp", CPP_FLAGS)
    assert base != cache_key(_good(), "cpp", CPP_FLAGS + ("-DFOO",))
    assert base != cache_key({**_good(), "kernel.cpp": ADD_CPP + "\n"}, "cpp", CPP_FLAGS)
    assert base != cache_key({**_good(), "extra.h": ""}, "cpp", CPP_FLAGS)
    cu = {"kernel.cu": ADD_CU}
    assert cache_key(cu, "cuda", ("-arch=sm_90a",)) != cache_key(cu, "cuda", ("-arch=sm_80",))


def test_extra_flags_change_the_key_and_reach_the_compiler(tmp_path: Path) -> None:
    source = "#ifndef MUST_BE_SET\n#error MUST_BE_SET missing\n#endif\nextern \"C\" int f() { return 1; }\n"
    without = compile_kernel({"kernel.cpp": source}, "cpp", tmp_path)
    with_flag = compile_kernel({"kernel.cpp": source}, "cpp", tmp_path, extra_flags=["-DMUST_BE_SET"])
    assert not without.ok and "MUST_BE_SET missing" in without.log
    assert with_flag.ok and not with_flag.cache_hit and with_flag.key != without.key


@needs_nvcc
def test_cuda_kernel_compiles_with_nvcc_for_sm90a(tmp_path: Path) -> None:
    result = compile_kernel({"kernel.cu": ADD_CU}, "cuda", tmp_path, arch="sm_90a")
    assert result.ok, result.log
    assert Path(result.library).stat().st_size > 0
    ctypes.CDLL(result.library)  # static cudart: loads without a GPU, as long as nothing is launched
    hit = compile_kernel({"kernel.cu": ADD_CU}, "cuda", tmp_path, arch="sm_90a")
    assert hit.cache_hit and hit.library == result.library
    print(f"\nnvcc -shared of a small kernel (sm_90a): {result.seconds:.2f} s; hit {hit.seconds * 1e3:.2f} ms")


@needs_nvcc
def test_cuda_default_arch_is_sm90a_without_a_gpu(tmp_path: Path) -> None:
    if os.path.exists("/dev/nvidia0"):
        pytest.skip("a GPU is visible: the default arch is the GPU's")
    explicit = compile_kernel({"kernel.cu": ADD_CU}, "cuda", tmp_path, arch="sm_90a")
    default = compile_kernel({"kernel.cu": ADD_CU}, "cuda", tmp_path)
    assert default.ok and default.cache_hit and default.key == explicit.key


@needs_nvcc
def test_cuda_errors_are_located(tmp_path: Path) -> None:
    broken = ADD_CU.replace("out[i] = a[i] + b[i];", "out[i] = a[i] + c[i];")
    result = compile_kernel({"kernel.cu": broken}, "cuda", tmp_path, arch="sm_90a")
    assert not result.ok
    assert 'kernel.cu(5): error: identifier "c" is undefined' in result.log
    assert "detected in the compilation" not in result.log


def test_timeout_kills_the_whole_compiler(tmp_path: Path) -> None:
    # Constant evaluation of 4e10 steps: hours of cc1plus, once its ops limit is lifted.
    source = (
        "constexpr long spin() { long s = 0;\n"
        "  for (long i = 0; i < 200000; ++i) for (long j = 0; j < 200000; ++j) s += i ^ j;\n"
        "  return s; }\n"
        'constexpr long value = spin();\nextern "C" long get() { return value; }\n'
    )
    marker = f"-DTIMEOUT_MARKER_{uuid.uuid4().hex}"
    flags = ["-fconstexpr-ops-limit=1000000000000", "-fconstexpr-loop-limit=1000000", marker]
    start = time.perf_counter()
    result = compile_kernel({"kernel.cpp": source}, "cpp", tmp_path, timeout_s=1.5, extra_flags=flags)
    assert not result.ok and not result.infra
    assert result.log == "compile timed out after 1.5 s"
    assert time.perf_counter() - start < 10
    assert _processes_with(marker) == []  # cc1plus, not just the g++ driver, is gone
    assert not any(tmp_path.iterdir())  # a timeout is not cached: load, not source, may be to blame


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def test_concurrent_compiles_of_one_key_are_safe(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    files = {"kernel.cpp": 'extern "C" int answer() { return 42; }\n'}
    with ThreadPoolExecutor(4) as pool:
        results: list[CompileResult] = list(pool.map(lambda _: compile_kernel(files, "cpp", tmp_path), range(4)))
    assert all(r.ok for r in results) and len({r.library for r in results}) == 1
    assert ctypes.CDLL(results[0].library).answer() == 42
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{results[0].key}.so"]  # no temp files left


def test_summary_of_gxx_output() -> None:
    output = "\n".join(
        [
            "/tmp/cuda-agent-compile-abc123/kernel.cpp: In function 'void f()':",
            "/tmp/cuda-agent-compile-abc123/kernel.cpp:12:5: error: 'x' was not declared in this scope",
            "   12 |     x = 1;",
            "      |     ^",
            "In file included from /usr/include/c++/12/vector:64,",
            "/usr/include/c++/12/bits/stl_vector.h:1276:7: note: candidate: 'void push_back()'",
        ]
        + [f"kernel.cpp:{20 + i}:1: error: bad thing {i}" for i in range(11)]
    )
    summary = summarize_compiler_errors(output)
    lines = summary.splitlines()
    assert lines[0] == "kernel.cpp:12:5: error: 'x' was not declared in this scope"
    assert lines[1:3] == ["   12 |     x = 1;", "      |     ^"]
    assert "note:" not in summary and "/tmp" not in summary
    assert lines[-1] == "... and 7 more errors"
    assert "bad thing 3" in summary and "bad thing 4" not in summary


def test_summary_drops_repeated_errors() -> None:
    line = "kernel.cpp:6:35: error: invalid conversion from 'const char*' to 'int'"
    output = "\n".join([line, "    6 |   v.push_back(\"s\");", line, "    6 |   v.push_back(\"s\");"])
    assert summarize_compiler_errors(output) == "\n".join(output.splitlines()[:2])


def test_summary_of_nvcc_and_linker_output() -> None:
    output = "\n".join(
        [
            'kernel.cu(7): error: identifier "tid" is undefined',
            "      out[tid] = 0;",
            "          ^",
            "",
            "1 error detected in the compilation of \"kernel.cu\".",
            "/usr/bin/ld: /tmp/ccAbC123.o: in function `launch':",
            "kernel.cu:(.text+0x1a): undefined reference to `helper'",
            "collect2: error: ld returned 1 exit status",
            "ptxas fatal   : Unresolved extern function '_Z6helperf'",
        ]
    )
    summary = summarize_compiler_errors(output, max_errors=10)
    assert summary.splitlines() == [
        'kernel.cu(7): error: identifier "tid" is undefined',
        "      out[tid] = 0;",
        "          ^",
        "kernel.cu:(.text+0x1a): undefined reference to `helper'",
        "ptxas fatal   : Unresolved extern function '_Z6helperf'",
    ]


def test_summary_without_error_lines_is_the_tail() -> None:
    output = "\n".join(f"line {i}" for i in range(100))
    summary = summarize_compiler_errors(output)
    assert summary.splitlines() == [f"line {i}" for i in range(80, 100)]


# ---- the sandboxed compiler: a source file must not read what lies outside its work dir ----------


@pytest.fixture
def outside_file():
    """A file outside /tmp and outside any work dir, whose lines the compiler would quote."""
    folder = Path(tempfile.mkdtemp(prefix="compile-test-", dir="/var/tmp"))
    secret = folder / "secret.h"
    secret.write_text(f"SECRET_{uuid.uuid4().hex} is not C++;\n")
    yield secret
    shutil.rmtree(folder, ignore_errors=True)


def _leaked_lines(path: Path, log: str) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if len(line.strip()) > 12 and line.strip() in log]


@pytest.mark.parametrize("target", ["outside", "repo", "relative"])
def test_include_of_a_file_outside_the_work_dir_fails(tmp_path: Path, outside_file: Path, target: str) -> None:
    path = {
        "outside": str(outside_file),
        "repo": str(REPO / "env_pool" / "evaluate.py"),  # the environment's own code
        "relative": "../../../../../../.." + str(outside_file),  # from the work dir up to / and down
    }[target]
    result = compile_kernel({"kernel.cpp": f'#include "{path}"\nextern "C" int f() {{ return 1; }}\n'}, "cpp", tmp_path)
    assert not result.ok and not result.infra
    assert "No such file or directory" in result.log, result.log
    source = outside_file if target != "repo" else REPO / "env_pool" / "evaluate.py"
    assert _leaked_lines(source, result.log) == []


@pytest.mark.parametrize("path", ["/etc/hostname", "/etc/passwd", "/proc/1/environ", "/root/.bashrc"])
def test_include_of_system_files_outside_the_toolchain_fails(tmp_path: Path, path: str) -> None:
    # /proc/1 is the run's own init (its PID namespace); the kernel refuses its environ to a
    # process without capabilities.
    result = compile_kernel({"kernel.cpp": f'#include "{path}"\n'}, "cpp", tmp_path)
    assert not result.ok and not result.infra, result.log
    assert "No such file or directory" in result.log or "Permission denied" in result.log, result.log


@needs_nvcc
def test_nvcc_include_of_a_file_outside_fails(tmp_path: Path, outside_file: Path) -> None:
    result = compile_kernel({"kernel.cu": f'#include "{outside_file}"\n' + ADD_CU}, "cuda", tmp_path, arch="sm_90a")
    assert not result.ok and not result.infra and "No such file or directory" in result.log, result.log
    assert _leaked_lines(outside_file, result.log) == []


INCBIN = 'asm(".section .rodata\\n.globl blob\\nblob:\\n.incbin \\"{path}\\"\\n.previous");\nextern "C" int f() {{ return 1; }}\n'


def test_incbin_of_a_file_outside_fails(tmp_path: Path, outside_file: Path) -> None:
    inside = compile_kernel({"kernel.cpp": INCBIN.format(path="scale.h"), "scale.h": SCALE_H}, "cpp", tmp_path)
    assert inside.ok, inside.log  # the mechanism works: a file of the work dir is embedded
    assert SCALE_H.encode() in Path(inside.library).read_bytes()
    for path in (str(outside_file), str(REPO / "env_pool" / "evaluate.py")):
        result = compile_kernel({"kernel.cpp": INCBIN.format(path=path)}, "cpp", tmp_path)
        assert not result.ok and not result.infra, f"{path} was embedded"
        assert "file not found" in result.log or "No such file" in result.log, result.log


def test_compiler_environment_is_fixed(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_AGENT_TEST_API_KEY", "sk-do-not-leak")
    monkeypatch.setenv("CPLUS_INCLUDE_PATH", "/work")  # would steer g++ if it passed
    env = compiler_env(tmp_path)
    assert set(env) <= {"PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "CUDA_HOME"}
    assert env["LC_ALL"] == "C" and env["HOME"] == str(tmp_path) and env["TMPDIR"] == str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    outcome = _run_compiler(["sh", "-c", "env"], tmp_path, 30, 1024)
    assert outcome.failure is None, outcome.output
    names = {line.split("=", 1)[0] for line in outcome.output.splitlines() if "=" in line}
    assert names <= set(env) | {"PWD", "SHLVL", "_", "CUDA_AGENT_RESULT_FD"}, names
    assert "sk-do-not-leak" not in outcome.output and "CPLUS_INCLUDE_PATH" not in outcome.output


def test_compiler_sees_the_toolchain_and_its_work_dir_only(tmp_path: Path) -> None:
    (tmp_path / "tmp").mkdir()
    # The venv, and the interpreter's own prefix unless it is the system's (/usr on the GPU machines).
    view = toolchain_view()
    pythons = {p for p in (sys.prefix, sys.base_prefix) if not any(p == v or p.startswith(v + "/") for v in view)}
    script = f"""
        for p in /work /root /home /etc/passwd {REPO} {' '.join(sorted(pythons))} /var /opt /srv; do
            test -e "$p" && echo "VISIBLE $p"
        done
        for p in /usr/x /x /etc/x /tmp/../x; do touch "$p" 2>/dev/null && echo "WROTE $p"; done
        touch built.o tmp/t /tmp/t && echo "work dir writable"
        command -v g++ >/dev/null && echo "g++ found"
        """
    outcome = _run_compiler(["sh", "-c", script], tmp_path, 30, 1024)
    assert outcome.failure is None, outcome.output
    assert "VISIBLE" not in outcome.output and "WROTE" not in outcome.output, outcome.output
    assert "work dir writable" in outcome.output and "g++ found" in outcome.output
    assert set(COMPILE_ISOLATION) <= set(outcome.isolation)


def test_compile_without_its_isolation_is_infra_and_never_runs_bare(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(compile_module, "COMPILE_ISOLATION", (*COMPILE_ISOLATION, "no-such-protection"))
    result = compile_kernel(_good(), "cpp", tmp_path)
    assert not result.ok and result.infra and result.library is None
    assert "no-such-protection" in result.log
    assert list(tmp_path.iterdir()) == []  # infra failures are never cached


def test_compile_out_of_memory_is_not_cached(tmp_path: Path) -> None:
    source = '#include <bits/stdc++.h>\nextern "C" int f() { std::map<int, int> m; m[1] = 2; return m[1]; }\n'
    result = compile_kernel({"kernel.cpp": source}, "cpp", tmp_path, memory_mb=40)
    assert not result.ok and not result.infra and "out of memory" in result.log, result.log
    assert list(tmp_path.iterdir()) == []
    assert compile_kernel({"kernel.cpp": source}, "cpp", tmp_path).ok  # the default limit is enough
