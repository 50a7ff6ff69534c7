"""The rules of the game, as presets: the tolerance, the libraries a kernel may call, the build.

- ``strict``: this project's own. float32 outputs within atol = rtol = 1e-4 (TF32 off for
  candidates and baselines alike), no library does the computation (torch, BLAS, cuBLAS,
  cuDNN: all fallbacks), nvcc without fast math.
- ``paper``: the CUDA Agent paper's released skill file and verifier, which KernelBench's
  checker shares. Outputs within atol = rtol = 1e-2 (TF32 as torch leaves it: cuDNN's
  convolutions on, matmuls off), cuBLAS for GEMM and cuDNN for convolution allowed inside the
  candidate's own code (on the CPU: a BLAS library, the nearest thing), nvcc with
  ``--use_fast_math``. A user who compares with the paper's numbers plays this game.

Torch stays forbidden under both (anything that calls back into it is torch's time), and the
timing protocol (fresh inputs every call, the L2 flushed, the trusted harness's clock) is the
same: stricter than the paper's, never looser. Read by the harness (tolerance, TF32, the code
sampler's allowed libraries), the build (fast math), SKILL.md's rules section and the report.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

RULE_SETS = ("strict", "paper")


@dataclass(frozen=True)
class Rules:
    name: str
    tolerance: float | None  # atol = rtol of every floating output; None: tasks.task.DEFAULT_TOLERANCES by dtype
    tf32: bool  # TF32 as torch leaves it; False: off in the reference, the baselines and the candidate
    libraries: tuple[str, ...]  # file-name patterns of libraries whose time counts as the candidate's own
    fast_math: bool  # nvcc --use_fast_math
    skill_libraries: str  # SKILL.md's line on libraries
    skill_tolerance: str  # SKILL.md's line on the tolerance
    summary: str  # the evaluation report's line on them

    def allows(self, library_file: str) -> bool:
        """Whether time in this library (a file name: libcublas.so.13) counts as the candidate's own."""
        return any(re.match(pattern, library_file) for pattern in self.libraries)

    def tolerances(self, task_atol: float | None, task_rtol: float | None) -> tuple[float | None, float | None]:
        """The (atol, rtol) a task is checked with: its own where it sets one, else the rules' (None: by dtype)."""
        return (task_atol if task_atol is not None else self.tolerance, task_rtol if task_rtol is not None else self.tolerance)


STRICT = Rules(
    name="strict", tolerance=None, tf32=False, libraries=(), fast_math=False,
    skill_libraries=("Libraries do not compute for you either. Calling torch, numpy, cupy, triton, jax, cuBLAS, cuDNN, "
                     "CUTLASS, a BLAS or any other library for the computation, from Python or from your native code, "
                     "is a fallback too, whatever its speed (these are the strict rules: `env.rules=paper` allows "
                     "cuBLAS and cuDNN, as the paper's skill file does). Your own kernel files may use the language's "
                     "standard library and compiler intrinsics (and libm)."),
    skill_tolerance=("float32 tolerance is atol = rtol = 1e-4 (the strict rules). TF32 and fp16 arithmetic on fp32 "
                     "data is not accurate enough."),
    summary="float32 outputs within 1e-4, TF32 off, no library computes for a kernel (cuBLAS and cuDNN are fallbacks)",
)

PAPER = Rules(
    name="paper", tolerance=1e-2, tf32=True,
    libraries=(r"^libcublas(Lt)?\.so", r"^libcudnn[\w-]*\.so", r"^lib(scipy_)?openblas[\w.-]*\.so", r"^libblis[\w.-]*\.so"),
    fast_math=True,
    skill_libraries=("Under the paper's rules (`env.rules=paper`) your own code may call cuBLAS for GEMMs and cuDNN for "
                     "convolutions (on the CPU: a BLAS library, such as numpy's bundled OpenBLAS through ctypes) and "
                     "fuse your own kernels around them. Torch stays forbidden, from Python or native code, and so does "
                     "every other library (numpy's own functions, cupy, triton, jax, CUTLASS)."),
    skill_tolerance=("Outputs must be within atol = rtol = 1e-2 (the paper's rules, as KernelBench checks): TF32 "
                     "tensor cores and fp16 arithmetic may pass; check your error."),
    summary=("outputs within atol = rtol = 1e-2, TF32 as torch leaves it, cuBLAS and cuDNN allowed inside a kernel's "
             "own code, nvcc --use_fast_math (the paper's skill file and verifier)"),
)

PRESETS = {rules.name: rules for rules in (STRICT, PAPER)}


def rules_named(name: str) -> Rules:
    name = str(name)
    if name not in PRESETS:
        raise ValueError(f"unknown rule set {name!r} (env.rules); use one of {', '.join(RULE_SETS)}")
    return PRESETS[name]
