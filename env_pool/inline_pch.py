"""A precompiled torch/extension.h for load_inline builds: torch's headers parsed once per machine.

A KernelBench solution's ``load_inline`` compiles a main.cpp that begins with
``#include <torch/extension.h>``: parsing those headers is most of the build (about 20 s of a
27 s build on a 2-core CPU), and every candidate paid it again. GCC uses a precompiled header
that it finds in an include directory before the header itself, when it was made by the same
compiler with the same macros and code-generation options; otherwise it parses the header as
usual, so a stale or mismatched one costs time, never a wrong build. The import child gets
``CPATH=<ready folder>`` (env_pool/evaluate.py): searched after the command line's ``-I``
folders and before torch's ``-isystem`` ones, so ``torch/extension.h`` is looked up there first.

TRUSTED: built by the worker from torch's own headers with load_inline's own flags (read from
torch's ninja writer, never copied by hand), into a folder candidates see read-only. Nothing a
candidate wrote goes into it. nvcc's host passes preprocess first (``gcc -E``), which never
loads a precompiled header, so a .cu file is compiled as before.

Two variants: unoptimised (load_inline's default flags) and optimised (``-O3``: GCC checks
``__OPTIMIZE__``, so it serves ``-O1`` to ``-O3``). Flags beyond these (``-DNDEBUG``, ``-g``)
simply do not match and build as before. Each variant is checked after its build by compiling
a probe with ``-H``, which marks a precompiled header it used with "!".
"""
from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path

HEADER = "torch/extension.h"
VARIANTS = {"plain": (), "optimized": ("-O3",)}
BUILD_TIMEOUT_S = 900.0  # one variant: ~40 s on an idle CPU core, minutes on a busy one
PR_SET_PDEATHSIG = 1
PROBE = "#include <torch/extension.h>\n#include <torch/extension.h>\nint cuda_agent_pch_probe() { return 0; }\n"

_building: dict[Path, threading.Thread] = {}
_lock = threading.Lock()


def ready_dir(root: Path, backend: str, cpus: list[int] | None = None) -> Path | None:
    """The folder to put on CPATH, once its headers are built and checked; None until then.

    The first call for a machine's toolchain starts the build in a background thread (one
    process at a time machine-wide, by a lock file); evaluations go on without it meanwhile.
    """
    try:
        compiler, flags, key = target(backend == "cuda")
    except Exception:  # a torch whose private ninja writer changed: no PCH, builds as before
        return None
    folder = root.expanduser() / key
    if (folder / "ok").exists():
        return folder
    if (folder / "failed").exists():
        return None
    with _lock:
        if folder not in _building or not _building[folder].is_alive():
            thread = threading.Thread(target=build, args=(folder, compiler, flags, cpus), daemon=True,
                                      name="inline-pch")
            _building[folder] = thread
            thread.start()
    return None


@functools.lru_cache(maxsize=None)
def target(with_cuda: bool) -> tuple[str, list[str], str]:
    """(compiler, flags, folder name) of this machine's load_inline builds; fixed for the process's life."""
    flags, compiler = load_inline_flags(with_cuda)
    return compiler, flags, _key(compiler, flags)


def load_inline_flags(with_cuda: bool) -> tuple[list[str], str]:
    """The flags and compiler load_inline gives main.cpp, read from torch's own ninja writer.

    The extension's name (``-DTORCH_EXTENSION_NAME``) is dropped: torch's headers never name it.
    """
    from torch.utils import cpp_extension

    with tempfile.TemporaryDirectory() as tmp:
        ninja = Path(tmp) / "build.ninja"
        cpp_extension._write_ninja_file_to_build_library(
            path=str(ninja), name="cuda_agent_pch", sources=[str(Path(tmp) / "main.cpp")], extra_cflags=[],
            extra_cuda_cflags=[], extra_sycl_cflags=[], extra_ldflags=[], extra_include_paths=[],
            with_cuda=with_cuda, with_sycl=False, is_standalone=False)
        lines = dict(line.split(" = ", 1) for line in ninja.read_text().splitlines() if " = " in line)
    flags = [f for f in shlex.split(lines["cflags"]) if not f.startswith("-DTORCH_EXTENSION_NAME=")]
    return flags, lines["cxx"].strip()


def header_path() -> Path:
    from torch.utils import cpp_extension

    return Path(cpp_extension._TORCH_PATH) / "include" / HEADER


def _key(compiler: str, flags: list[str]) -> str:
    """The folder's name: the compiler's identity, torch's headers and the flags."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    found = shutil.which(compiler) or compiler
    head = header_path()
    facts = [version, os.path.realpath(found), str(head), str(head.stat().st_mtime_ns), *flags]
    return hashlib.sha256("\0".join(facts).encode()).hexdigest()[:20]


def build(folder: Path, compiler: str, flags: list[str], cpus: list[int] | None = None) -> bool:
    """Build and check every variant into ``folder``; writes ``ok`` or ``failed`` (with why)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # another worker on this machine builds it; the next evaluation looks again
        if (folder / "ok").exists() or (folder / "failed").exists():
            return (folder / "ok").exists()
        for stale in folder.parent.glob(f"{folder.name}.*"):  # a build whose process died (its lock is free)
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
        staging = folder.with_name(f"{folder.name}.{uuid.uuid4().hex}")
        why = _build_variants(staging, compiler, flags, cpus)
        if why:
            shutil.rmtree(staging, ignore_errors=True)
            folder.mkdir(exist_ok=True)
            (folder / "failed").write_text(why)
            return False
        (staging / "ok").write_text("checked: every variant is used by a load_inline-flagged probe\n")
        os.rename(staging, folder)
        return True


def _build_variants(staging: Path, compiler: str, flags: list[str], cpus: list[int] | None) -> str:
    """Empty when every variant is built and used by a probe; otherwise why not."""
    target = staging / (HEADER + ".gch")
    target.mkdir(parents=True)
    # The header itself beside it: GCC takes a used PCH's folder as where the header lives, and a
    # second #include of it (KernelBench's cpp_sources repeat the one load_inline adds) opens it there.
    (staging / HEADER).symlink_to(header_path())
    for name, extra in VARIANTS.items():
        out = target / f"{name}.gch"
        cmd = [compiler, *flags, *extra, "-x", "c++-header", str(header_path()), "-o", str(out)]
        done = _run(cmd, staging, cpus)
        if done.returncode != 0:
            return f"building the {name} variant failed ({done.returncode}):\n{done.stderr[-2000:]}"
        probe = staging / "probe.cpp"
        probe.write_text(PROBE)
        checked = _run([compiler, *flags, *extra, "-H", "-Winvalid-pch", "-fsyntax-only", str(probe)], staging, cpus,
                       {"CPATH": str(staging)})
        probe.unlink()
        if checked.returncode != 0 or f"! {out}" not in checked.stderr:
            return f"the {name} variant was built but a probe with load_inline's flags did not use it:\n{checked.stderr[-2000:]}"
    return ""


def _run(cmd: list[str], cwd: Path, cpus: list[int] | None, extra_env: dict[str, str] | None = None):
    """A compiler run at the lowest priority, off the timed CPUs where there are others."""
    def lower() -> None:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # a worker that exits takes its build along
        os.nice(19)
        if cpus:
            os.sched_setaffinity(0, cpus)

    env = {k: v for k, v in os.environ.items() if k != "CPATH"}  # only the folder being checked
    env.update(LC_ALL="C", **(extra_env or {}))
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, env=env,
                              preexec_fn=lower)
    except (subprocess.TimeoutExpired, OSError) as err:
        return subprocess.CompletedProcess(cmd, -1, "", f"{type(err).__name__}: {err}")


if __name__ == "__main__":  # build now, in the foreground: python -m env_pool.inline_pch DIR [cuda]
    compiler_, flags_, key_ = target(sys.argv[2:3] == ["cuda"])
    dest = Path(sys.argv[1]).expanduser() / key_
    print(dest, "ok" if build(dest, compiler_, flags_) else (dest / "failed").read_text() if (dest / "failed").exists() else "busy")
