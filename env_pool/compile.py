"""The fast compile path: a candidate's kernel source -> a shared library loaded through ctypes.

Device code is compiled without torch headers (extern "C" launchers), which costs about a
second instead of the minute that torch/extension.h costs (DESIGN.md, "Measured here"). The
candidate's ``model_new.py`` loads the resulting ``.so`` with ctypes.

Compiles are content-addressed: identical sources, flags, target and toolchain give the same
key, so an agent that recompiles unchanged code (it often does) pays nothing, and neither does
a second worker evaluating the same candidate. Failed compiles are cached as their log.

Nothing here raises for a bad candidate: every outcome is a CompileResult.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Mapping

# --no-undefined: a shared library links happily with unresolved symbols, which then only
# surface as a cryptic dlopen failure inside the candidate's process; failing at link time
# gives the agent the readable "undefined reference" instead.
CPP_FLAGS = ("-O3", "-march=native", "-fopenmp", "-std=c++17", "-shared", "-fPIC", "-Wl,--no-undefined")
CUDA_FLAGS = (
    "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
    "--expt-relaxed-constexpr", "-lineinfo", "-Xlinker", "--no-undefined",
)
DEFAULT_CUDA_ARCH = "sm_90a"  # the H100/H200 target, so CPU machines can compile-check for it


@dataclass(frozen=True)
class BackendSpec:
    compiler: str
    source: str  # the one translation unit the backend compiles
    headers: tuple[str, ...]  # extensions that may sit beside it, for #include
    flags: tuple[str, ...]


BACKENDS = {
    "cpp": BackendSpec("g++", "kernel.cpp", (".h", ".hpp"), CPP_FLAGS),
    "cuda": BackendSpec("nvcc", "kernel.cu", (".cuh", ".h", ".hpp"), CUDA_FLAGS),
}

MAX_SOURCE_BYTES = 4 << 20  # a bound on what a candidate can make us write and hash
MAX_OUTPUT_BYTES = 1 << 20  # template errors can run to megabytes; the first MiB says enough
# Files that look like compiler input: each must be the backend's source or one of its headers,
# so an agent that writes helper.cu next to kernel.cpp, or ships a prebuilt .o, hears why it
# is not compiled instead of wondering why its code has no effect.
_C_FAMILY = (
    ".c", ".cc", ".cpp", ".cxx", ".c++", ".cu", ".h", ".hh", ".hpp", ".hxx", ".cuh", ".inl", ".inc",
    ".ipp", ".tpp", ".o", ".a", ".so", ".ptx", ".cubin", ".fatbin",
)
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


@dataclass
class CompileResult:
    ok: bool
    library: str | None  # path of the cached .so
    log: str  # short readable errors
    seconds: float
    cache_hit: bool
    key: str
    # The environment's fault (no compiler, disk full), not the candidate's: callers report it
    # as an "infra" failure and retry, and it is never cached.
    infra: bool = False


def compile_kernel(
    files: Mapping[str, str],
    backend: str,
    cache_dir: Path,
    timeout_s: float = 300,
    arch: str | None = None,
    extra_flags: Iterable[str] = (),
) -> CompileResult:
    """Compile a candidate's kernel into a cached shared library; see the module docstring."""
    start = time.perf_counter()
    result = _compile(files, backend, Path(cache_dir), timeout_s, arch, tuple(extra_flags))
    result.seconds = time.perf_counter() - start
    return result


def _compile(files, backend, cache_dir: Path, timeout_s, arch, extra_flags) -> CompileResult:
    spec = BACKENDS.get(backend)
    if spec is None:  # the task's configuration is wrong, not the candidate
        raise ValueError(f"unknown backend {backend!r}; expected one of {sorted(BACKENDS)}")
    problem = check_files(files, spec)
    if problem:
        return _failure(problem)
    files = kernel_files(files)  # model_new.py and notes neither reach the compiler nor the key
    flags = _flags(spec, backend, arch, extra_flags)
    key = cache_key(files, backend, flags)
    cached = _lookup(cache_dir, key)
    if cached is not None:
        return cached
    try:
        return _build(files, spec, flags, cache_dir, key, timeout_s)
    except OSError as e:  # temp dir or cache unwritable: the machine's fault, not the candidate's
        return _failure(f"compile environment error: {e}", key=key, infra=True)


def kernel_files(files: Mapping[str, str]) -> dict[str, str]:
    """The compiler's inputs: the C/C++/CUDA files of a whole solution (not model_new.py, notes)."""
    return {n: t for n, t in files.items() if isinstance(n, str) and n.lower().endswith(_C_FAMILY)}


def check_files(files: Mapping[str, str], spec: BackendSpec) -> str:
    """Why these files cannot be compiled, or "" when they can."""
    for name in files:
        if not isinstance(name, str) or not isinstance(files[name], str):
            return f"rejected file {name!r}: file names and contents must be text"
        if name.startswith("/") or "\\" in name or ".." in name.split("/"):
            return f"rejected file name {name!r}: paths must stay inside the workspace"
    inputs = kernel_files(files)
    for name in sorted(inputs):
        if not _SAFE_NAME.match(name) or ".." in name:
            return f"rejected file name {name!r}: use a plain file name (no directories, no '..')"
        if name != spec.source and not name.endswith(spec.headers):
            allowed = ", ".join(f"*{e}" for e in spec.headers)
            return (f"rejected file {name!r}: this backend compiles {spec.source} only, "
                    f"with headers ({allowed}) it includes")
    if spec.source not in files:
        return f"missing {spec.source}: the kernel source this backend compiles"
    size = sum(len(_encode(t)) for t in inputs.values())
    if size > MAX_SOURCE_BYTES:
        return f"sources are {size} bytes; the limit is {MAX_SOURCE_BYTES}"
    return ""


def cache_key(files: Mapping[str, str], backend: str, flags: tuple[str, ...]) -> str:
    """sha256 over everything that changes the output: sources, flags (arch included), toolchain."""
    spec = BACKENDS[backend]
    payload = {
        "backend": backend,
        "files": sorted(files.items()),
        "flags": list(flags),
        "toolchain": toolchain_fingerprint(spec.compiler, "-march=native" in flags),
    }
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()


@lru_cache(maxsize=None)
def default_arch() -> str:
    """The visible GPU's -arch, or sm_90a where there is none (CPU machines compile-check for it)."""
    # Only asked when the caller gave no arch. In a process that forks compile workers, pass
    # arch explicitly instead: querying torch.cuda initialises CUDA, which forked children
    # cannot use.
    try:
        import torch

        if not torch.cuda.is_available():
            return DEFAULT_CUDA_ARCH
        major, minor = torch.cuda.get_device_capability()
    except Exception:
        return DEFAULT_CUDA_ARCH
    # sm_90a unlocks the Hopper-only instructions (wgmma, TMA) that fast kernels use.
    return "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


@lru_cache(maxsize=None)
def toolchain_fingerprint(compiler: str, native: bool = False) -> str:
    """The compiler's --version (and, for -march=native, what native means on this host).

    A compiler upgrade must not serve stale libraries, and a cache shared between hosts must not
    hand a library built for one CPU to another that lacks its instructions (SIGILL).
    """
    parts = [_run_quiet([compiler, "--version"])]
    if compiler == "nvcc":  # nvcc hands host code to g++, so its version matters too
        parts.append(_run_quiet(["g++", "--version"]))
    if native:
        target = _run_quiet(["g++", "-march=native", "-Q", "--help=target"])
        parts += [line.strip() for line in target.splitlines() if re.match(r"\s+-m(arch|tune)=", line)]
    return "\n".join(parts)


def _run_quiet(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=_compiler_env()).stdout
    except (OSError, subprocess.SubprocessError):
        return f"unavailable: {cmd[0]}"


def _flags(spec: BackendSpec, backend: str, arch: str | None, extra: tuple[str, ...]) -> tuple[str, ...]:
    if backend == "cuda":
        return spec.flags + (f"-arch={arch or default_arch()}",) + extra
    return spec.flags + extra


# ----------------------------------------------------------------------------- the cache

def _paths(cache_dir: Path, key: str) -> tuple[Path, Path]:
    return cache_dir / f"{key}.so", cache_dir / f"{key}.err"


def _lookup(cache_dir: Path, key: str) -> CompileResult | None:
    library, errors = _paths(cache_dir, key)
    if library.exists():
        return CompileResult(True, str(library), "", 0.0, True, key)
    try:
        return CompileResult(False, None, errors.read_text(), 0.0, True, key)
    except OSError:
        return None


def _store(data: bytes, target: Path) -> None:
    # Write under a unique name, then rename: readers never see half a library, and two workers
    # racing on one key both rename identical bytes into place.
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- building

def _build(files, spec: BackendSpec, flags, cache_dir: Path, key: str, timeout_s: float) -> CompileResult:
    with tempfile.TemporaryDirectory(prefix="cuda-agent-compile-") as tmp:
        work = Path(tmp)
        for name, text in files.items():
            (work / name).write_bytes(_encode(text))
        # Relative names in a private cwd keep the temp dir out of most messages.
        cmd = [spec.compiler, *flags, spec.source, "-o", "kernel.so"]
        try:
            rc, output = _run_compiler(cmd, work, timeout_s)
        except FileNotFoundError:
            return _failure(f"{spec.compiler} not found on PATH", key=key, infra=True)
        if rc is None:
            # Not cached: a timeout can be the machine's load rather than the source.
            return _failure(f"compile timed out after {timeout_s:g} s", key=key)
        return _record(rc, output.replace(f"{work}/", ""), work / "kernel.so", cache_dir, key)


def _record(rc: int, output: str, built: Path, cache_dir: Path, key: str) -> CompileResult:
    library, errors = _paths(cache_dir, key)
    if rc == 0 and built.exists():
        _store(built.read_bytes(), library)
        return CompileResult(True, str(library), "", 0.0, False, key)
    log = summarize_compiler_errors(output) or f"compiler exited with status {rc} and printed nothing"
    if _killed(rc, output):  # out of memory, most likely: may pass on a quieter machine
        return _failure(log, key=key)
    _store(log.encode(), errors)
    return CompileResult(False, None, log, 0.0, False, key)


def _killed(rc: int, output: str) -> bool:
    return rc < 0 or "signal terminated program" in output or "Killed signal" in output


def _run_compiler(cmd: list[str], cwd: Path, timeout_s: float) -> tuple[int | None, str]:
    """(exit status, output); status None when it ran out of time and was killed."""
    log_path = cwd / ".compiler-output"
    with open(log_path, "wb") as log:
        # A session of its own, so a timeout kills nvcc's whole tree (cicc, ptxas, g++), not
        # just the driver; a file, not a pipe, so huge output cannot block the compiler.
        proc = subprocess.Popen(
            cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env=_compiler_env(),
        )
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc = None
    with open(log_path, "rb") as log:
        return rc, log.read(MAX_OUTPUT_BYTES).decode(errors="replace")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _compiler_env() -> dict[str, str]:
    # C locale: ASCII quotes and English messages, which the summariser and the agent both read.
    return {**os.environ, "LC_ALL": "C", "LANG": "C"}


def _encode(text: str) -> bytes:
    return text.encode("utf-8", errors="replace")  # lone surrogates from a model must not raise


def _failure(log: str, key: str = "", infra: bool = False) -> CompileResult:
    return CompileResult(False, None, log, 0.0, False, key, infra)


# ----------------------------------------------------------------------------- error summary

# g++ "file:line:col: error:", nvcc "file(line): error:", fatal and catastrophic ones included.
_LOCATED = re.compile(r"^\S[^:()]*?(?::\d+(?::\d+)?:|\(\d+\):)\s*(?:fatal |catastrophic )?error\b", re.I)
# Errors without a source line: "g++: error:", "ptxas fatal   :", "nvcc fatal   :".
_TOOL = re.compile(r"^[\w+.-]+(?::\s*|\s+)(?:fatal error|catastrophic error|fatal|error)\s*:", re.I)
_LINKER = re.compile(r"undefined reference to|multiple definition of|cannot find -l|relocation .* against")
_NOISE = re.compile(r"^(collect2: error: ld returned|\d+ errors? detected in the compilation)")
_TEMP_DIR = re.compile(
    r"(?<![\w.])(?:/tmp|/var/tmp|%s)/(?:[^\s:'\"`()/]+/)*" % re.escape(tempfile.gettempdir().rstrip("/"))
)
_MAX_LINE = 300  # one minified line must not flood the agent's context


def summarize_compiler_errors(output: str, max_errors: int = 5) -> str:
    """The first errors, each with its source line, temp paths stripped; or the output's tail."""
    lines = [_TEMP_DIR.sub("", line.rstrip())[:_MAX_LINE] for line in output.splitlines()]
    errors = _first_occurrences([i for i, line in enumerate(lines) if _is_error(line)], lines)
    if not errors:
        return "\n".join([line for line in lines if line.strip()][-20:])
    shown = [_with_context(lines, i) for i in errors[:max_errors]]
    rest = len(errors) - max_errors
    if rest > 0:
        shown.append(f"... and {rest} more error{'s' if rest > 1 else ''}")
    return "\n".join(shown)


def _first_occurrences(indices: list[int], lines: list[str]) -> list[int]:
    # g++ repeats an error once per overload candidate it tried: one copy says it all.
    first: dict[str, int] = {}
    for i in indices:
        first.setdefault(lines[i], i)
    return list(first.values())


def _is_error(line: str) -> bool:
    if _NOISE.match(line):
        return False
    return bool(_LOCATED.match(line) or _TOOL.match(line) or _LINKER.search(line))


def _with_context(lines: list[str], i: int) -> str:
    """The error line, plus the source line and caret the compiler printed under it, if any."""
    block = [lines[i]]
    for line in lines[i + 1 : i + 3]:
        if not line.startswith(" ") or not line.strip() or _is_error(line):
            break
        block.append(line)
    return "\n".join(block)
