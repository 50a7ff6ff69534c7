"""The fast compile path: a candidate's kernel source -> a shared library loaded through ctypes.

Device code is compiled without torch headers (extern "C" launchers), which costs about a
second instead of the minute that torch/extension.h costs on these machines. The
candidate's ``model_new.py`` loads the resulting ``.so`` with ctypes.

Compiles are content-addressed: identical sources, flags, target and toolchain give the same
key, so an agent that recompiles unchanged code (it often does) pays nothing, and neither does
a second worker evaluating the same candidate. Failed compiles are cached as their log.

The compiler runs in the sandbox (env_pool/isolation/sandbox.py), because a source file can read files:
``#include "/etc/passwd"`` prints lines of it in the errors, ``asm(".incbin \"...\"")`` copies
a whole file into the library. It sees a fresh root holding only the work dir (writable) and
the toolchain (read-only: /usr, the /bin and /lib links, the loader's cache, the CUDA
toolkit), with a fixed environment, no network, no capabilities, and memory and time limits.
Where the sandbox cannot give that (COMPILE_ISOLATION), the compile is an infra failure:
it never falls back to an unsandboxed run.

Nothing here raises for a bad candidate: every outcome is a CompileResult.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Mapping

from env_pool.isolation.sandbox import SandboxError, SandboxLimits, SandboxOutcome, run_sandboxed
from tasks.solution import KERNEL_FILES

EXTENSIONS = ".torch_extensions"  # TORCH_EXTENSIONS_DIR in the scratch folder: where load_inline builds

# --no-undefined: a shared library links happily with unresolved symbols, which then only
# surface as a cryptic dlopen failure inside the candidate's process; failing at link time
# gives the agent the readable "undefined reference" instead.
CPP_FLAGS = ("-O3", "-march=native", "-fopenmp", "-std=c++17", "-shared", "-fPIC", "-Wl,--no-undefined")
CUDA_FLAGS = (
    "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
    "--expt-relaxed-constexpr", "-lineinfo", "-Xlinker", "--no-undefined",
)
DEFAULT_CUDA_ARCH = "sm_90a"  # the H100/H200 target, so CPU machines can compile-check for it

# What the compiler's sandbox must give (SandboxLimits.required_isolation): the toolchain-only
# root (read-only), no network, no capabilities, its own PID namespace. Missing one: infra.
COMPILE_ISOLATION = ("visible-only", "readonly-root", "netns", "no-caps", "pidns")
DEFAULT_COMPILE_MEMORY_MB = 4096  # resident memory of the compiler's whole process tree
# The system toolchain as the compiler sees it: binaries, binutils, headers and libraries under
# /usr; /bin, /lib, ... (links into /usr on merged systems: recreated as links); the loader's
# cache; the alternatives links (cc, c++ may lead through them). Kept where they exist.
_SYSTEM_VIEW = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache", "/etc/alternatives")
_COMPILERS = ("g++", "nvcc")


@dataclass(frozen=True)
class BackendSpec:
    compiler: str
    source: str  # the one translation unit the backend compiles
    headers: tuple[str, ...]  # extensions that may sit beside it, for #include
    flags: tuple[str, ...]


# The file names are the solution format's (tasks/solution.py), which the agent's workspace checks too.
BACKENDS = {
    "cpp": BackendSpec("g++", KERNEL_FILES["cpp"].source, KERNEL_FILES["cpp"].headers, CPP_FLAGS),
    "cuda": BackendSpec("nvcc", KERNEL_FILES["cuda"].source, KERNEL_FILES["cuda"].headers, CUDA_FLAGS),
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
    memory_mb: int = DEFAULT_COMPILE_MEMORY_MB,
    cpus: tuple[int, ...] = (),
) -> CompileResult:
    """Compile a candidate's kernel into a cached shared library, on ``cpus`` (empty: anywhere); see the module docstring."""
    start = time.perf_counter()
    result = _compile(files, backend, Path(cache_dir), timeout_s, arch, tuple(extra_flags), memory_mb, tuple(cpus))
    result.seconds = time.perf_counter() - start
    return result


def _compile(files, backend, cache_dir: Path, timeout_s, arch, extra_flags, memory_mb, cpus) -> CompileResult:
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
        return _build(files, spec, flags, cache_dir, key, timeout_s, memory_mb, cpus)
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
        # Trusted (no candidate input): a plain subprocess, with the compiler's fixed environment.
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=compiler_env()).stdout
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

def _build(files, spec: BackendSpec, flags, cache_dir: Path, key: str, timeout_s: float, memory_mb: int,
           cpus: tuple[int, ...]) -> CompileResult:
    with tempfile.TemporaryDirectory(prefix="cuda-agent-compile-") as tmp:
        work = Path(tmp)
        for name, text in files.items():
            (work / name).write_bytes(_encode(text))
        (work / "tmp").mkdir()  # the compiler's TMPDIR (nvcc's intermediate files)
        if shutil.which(spec.compiler, path=compiler_env()["PATH"]) is None:
            return _failure(f"{spec.compiler} not found on PATH", key=key, infra=True)
        # Relative names in a private cwd keep the temp dir out of most messages.
        cmd = [spec.compiler, *flags, spec.source, "-o", "kernel.so"]
        try:
            outcome = _run_compiler(cmd, work, timeout_s, memory_mb, cpus)
        except SandboxError as e:  # the machine cannot isolate the compiler: never run it bare
            return _failure(f"compile sandbox unavailable: {e}", key=key, infra=True)
        if outcome.timed_out or outcome.cpu_limited:
            # Not cached: a timeout can be the machine's load rather than the source.
            return _failure(f"compile timed out after {timeout_s:g} s", key=key)
        output = outcome.output.replace(f"{work}/", "")
        if outcome.out_of_memory:  # not cached either: it may pass on a quieter machine
            log = summarize_compiler_errors(output)
            return _failure(f"{log}\ncompiler ran out of memory (limit {memory_mb} MB)".lstrip(), key=key)
        return _record(_exit_status(outcome), output, work / "kernel.so", cache_dir, key)


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


def _exit_status(outcome: SandboxOutcome) -> int:
    """The exit code, or -N for a death by signal N (as subprocess reports it)."""
    if outcome.returncode is not None:
        return outcome.returncode
    try:
        return -signal.Signals[outcome.signal_name or ""].value
    except KeyError:
        return -1


def _run_compiler(cmd: list[str], cwd: Path, timeout_s: float, memory_mb: int, cpus: tuple[int, ...] = ()) -> SandboxOutcome:
    """Run the compiler in the sandbox; raises SandboxError when COMPILE_ISOLATION is not to be had.

    The sandbox kills the whole tree at the limits (nvcc's cicc, ptxas and g++ too, not just
    the driver) and keeps the first and last half MiB of the output (template errors can run
    to megabytes; the summariser reads the first errors).
    """
    limits = SandboxLimits(
        wall_s=timeout_s,
        memory_mb=memory_mb,
        max_output_chars=MAX_OUTPUT_BYTES,
        visible_paths=toolchain_view(),
        required_isolation=COMPILE_ISOLATION,
        cpus=cpus,
    )
    return run_sandboxed(cmd, b"", cwd, limits, env=compiler_env(cwd), inherit_env=False)


def compiler_env(work: Path | None = None) -> dict[str, str]:
    """The compiler's whole environment: fixed, nothing of the worker's (which may hold API keys).

    C locale: ASCII quotes and English messages, which the summariser and the agent both read.
    HOME and TMPDIR inside the work dir: the only writable place the compiler has.
    """
    env = {"PATH": os.pathsep.join(toolchain_path()), "LANG": "C", "LC_ALL": "C"}
    if work is not None:
        env.update(HOME=str(work), TMPDIR=str(work / "tmp"))
    if os.environ.get("CUDA_HOME"):
        env["CUDA_HOME"] = os.environ["CUDA_HOME"]
    return env


@lru_cache(maxsize=None)
def toolchain_view() -> tuple[str, ...]:
    """What the sandboxed compiler sees besides its work dir: the system and CUDA toolchains.

    Each compiler found on the worker's PATH brings its installation prefix (the parent of its
    real bin dir: /usr for g++, /usr/local/cuda-X.Y for nvcc); a prefix of "/" would bring
    everything, so then only the bin dir comes. The sandbox resolves symlinks and recreates
    the links on the way (/lib64 -> usr/lib64, /usr/local/cuda -> cuda-X.Y).
    """
    paths = [p for p in _SYSTEM_VIEW if os.path.lexists(p)]
    for found in filter(None, map(shutil.which, _COMPILERS)):
        real_bin = os.path.dirname(os.path.realpath(found))
        prefix = os.path.dirname(real_bin)
        paths += [os.path.dirname(found), prefix if prefix != "/" else real_bin]
    paths += _cuda_homes()
    return tuple(dict.fromkeys(p for p in paths if os.path.exists(p)))


@lru_cache(maxsize=None)
def toolchain_path() -> tuple[str, ...]:
    """The compiler's PATH: where the compilers were found, the CUDA bin dirs, the system's."""
    dirs = [os.path.dirname(found) for found in filter(None, map(shutil.which, _COMPILERS))]
    dirs += [os.path.join(home, "bin") for home in _cuda_homes()]
    dirs += ["/usr/local/bin", "/usr/bin", "/bin"]
    return tuple(dict.fromkeys(d for d in dirs if os.path.isdir(d)))


def _cuda_homes() -> list[str]:
    # nvcc may be a wrapper script (/usr/local/bin/nvcc here) whose real toolkit its path
    # does not show: the usual names of the toolkit come too.
    homes = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    return [h for h in homes if h and os.path.isdir(h)]


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
