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

The build outlives the command that needs it: one job per machine and toolchain
(``python -m env_pool.build.inline_pch --job``, started by ``start_job`` in a session of its own),
which holds the key's lock file for its whole life and runs its compilers in the sandbox, whose
PID namespace takes the compiler's own children (``cc1plus``) down with the job. A build in a
thread of the command was orphaned at every exit instead: the driver died with it, its
``cc1plus`` (1.7-1.9 GB) went on alone, and the next command, finding the lock free, started
another (issue #32). A lock that can be taken means no job is alive; a later command that finds
it held goes on without the header.
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from env_pool.isolation.sandbox import SandboxError, SandboxLimits, SandboxOutcome, run_sandboxed

HEADER = "torch/extension.h"
VARIANTS = {"plain": (), "optimized": ("-O3",)}
BUILD_TIMEOUT_S = 900.0  # one variant: ~40 s on an idle CPU core, minutes on a busy one
BUILD_MEMORY_MB = 8192  # one variant's cc1plus: 1.7-1.9 GB of RSS
BUILD_FILE_MB = 4096  # a variant's .gch is hundreds of MB (the sandbox's default cap on a file is 1 GB)
BUILD_OUTPUT_CHARS = 64_000  # the probe's -H lists every header; the "!" line of the PCH comes first
PROBE = "#include <torch/extension.h>\n#include <torch/extension.h>\nint cuda_agent_pch_probe() { return 0; }\n"

_jobs: list[subprocess.Popen] = []  # the jobs this process started, kept to be reaped
_lock = threading.Lock()


def ready_dir(root: Path, backend: str, cpus: list[int] | None = None) -> Path | None:
    """The folder to put on CPATH, once its headers are built and checked; None until then.

    The first call on a machine starts the build as a job of its own (``start_job``); this call
    and later ones go on without the header until the job has marked it ``ok``.
    """
    try:
        compiler, flags, key = target(backend == "cuda")
    except Exception:  # a torch whose private ninja writer changed: no PCH, builds as before
        return None
    folder = root.expanduser() / key
    with _lock:  # a job this process started, and that has ended, is reaped here (not left a zombie)
        _jobs[:] = [job for job in _jobs if job.poll() is None]
    if (folder / "ok").exists():
        return folder
    if not (folder / "failed").exists():
        start_job(folder, compiler, flags, cpus)
    return None


def start_job(folder: Path, compiler: str, flags: list[str], cpus: list[int] | None = None) -> bool:
    """Start the build of ``folder`` as a detached job, unless one holds its lock; True when this call started it.

    The job outlives the command that starts it (a build takes minutes, a command seconds), so it
    is not the command's child in any way that matters: its own session (no Ctrl-C of the
    command's terminal reaches it), stdin from /dev/null, its output in ``<key>.log``. The lock
    is taken here and handed over: the job inherits this open file, so the lock is held from
    this moment to the job's last breath, by the job alone once this process closes its copy or
    exits. There is no window in which two commands both find it free and both build. The job
    is given the compiler, flags and header as they were read here, so it never imports torch
    (~280 MB held for minutes).
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    lock = os.open(folder.parent / f"{folder.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a job builds it now
        if (folder / "ok").exists() or (folder / "failed").exists():
            return False
        recipe = json.dumps({"compiler": compiler, "flags": list(flags), "header": str(header_path())})
        command = [sys.executable, "-m", "env_pool.build.inline_pch", str(folder), "--job", recipe, "--lock-fd", str(lock)]
        command += ["--cpus", ",".join(map(str, cpus))] if cpus else []
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        with open(folder.parent / f"{folder.name}.log", "ab") as log:
            job = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   pass_fds=(lock,), start_new_session=True, cwd=folder.parent)
        with _lock:
            _jobs.append(job)
        return True
    finally:
        os.close(lock)  # the lock stays held: the job has the same open file


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
    """Build and check every variant into ``folder`` now, in this process; False when another holds the lock."""
    header = header_path()
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a job builds it; the next evaluation looks again
        return _build_locked(folder, compiler, flags, header, cpus)


def _build_locked(folder: Path, compiler: str, flags: list[str], header: Path, cpus: list[int] | None) -> bool:
    """Build and check every variant into ``folder``, its lock held; writes ``ok`` or ``failed`` (with why).

    Resumable: the variants are built in ``<key>.partial``, each marked once its probe used it,
    so a job that was killed (the machine rebooted, a user ended it) leaves its checked variants
    to the next one. A lock that can be taken means no job is alive, so whatever else is there
    (older builds' staging folders) is stale.
    """
    if (folder / "ok").exists() or (folder / "failed").exists():
        return (folder / "ok").exists()
    staging = folder.with_name(f"{folder.name}.partial")
    for stale in folder.parent.glob(f"{folder.name}.*"):
        if stale.is_dir() and stale != staging:
            shutil.rmtree(stale, ignore_errors=True)
    try:
        why = _build_variants(staging, compiler, flags, header, cpus)
    except SandboxError as err:  # this machine cannot run the build now: no verdict on the header
        _say(f"the build could not run: {err}")
        return False
    if why:
        shutil.rmtree(staging, ignore_errors=True)
        folder.mkdir(exist_ok=True)
        (folder / "failed").write_text(why)
        _say(f"failed: {why.splitlines()[0]}")
        return False
    shutil.rmtree(staging / "tmp", ignore_errors=True)  # the sandbox's TMPDIR
    for mark in staging.glob("*.checked"):
        mark.unlink()
    (staging / "ok").write_text("checked: every variant is used by a load_inline-flagged probe\n")
    os.rename(staging, folder)
    _say(f"ok: {folder}")
    return True


def _build_variants(staging: Path, compiler: str, flags: list[str], header: Path, cpus: list[int] | None) -> str:
    """Empty when every variant is built and used by a probe; otherwise why not."""
    target = staging / (HEADER + ".gch")
    target.mkdir(parents=True, exist_ok=True)
    # The header itself beside it: GCC takes a used PCH's folder as where the header lives, and a
    # second #include of it (KernelBench's cpp_sources repeat the one load_inline adds) opens it there.
    if not (staging / HEADER).is_symlink():
        (staging / HEADER).symlink_to(header)
    for name, extra in VARIANTS.items():
        checked = staging / f"{name}.checked"
        if checked.exists():
            _say(f"{name}: kept from an earlier job")
            continue
        begin = time.monotonic()
        out = target / f"{name}.gch"
        done = _run([compiler, *flags, *extra, "-x", "c++-header", str(header), "-o", str(out)], staging, cpus)
        if done.failure or done.returncode != 0:
            return f"building the {name} variant failed ({_ended(done)}):\n{done.output[-2000:]}"
        probe = staging / "probe.cpp"
        probe.write_text(PROBE)
        used = _run([compiler, *flags, *extra, "-H", "-Winvalid-pch", "-fsyntax-only", str(probe)], staging, cpus,
                    {"CPATH": str(staging)})
        probe.unlink()
        if used.failure or used.returncode != 0 or f"! {out}" not in used.output:
            return f"the {name} variant was built but a probe with load_inline's flags did not use it:\n{used.output[-2000:]}"
        checked.write_text(f"built and used by the probe in {time.monotonic() - begin:.0f} s\n")
        _say(f"{name}: built and checked in {time.monotonic() - begin:.0f} s")
    return ""


def _run(cmd: list[str], cwd: Path, cpus: list[int] | None, extra_env: dict[str, str] | None = None) -> SandboxOutcome:
    """A compiler run in the sandbox, for its PID namespace: the compiler's whole tree (the driver's
    ``cc1plus`` too, which a PR_SET_PDEATHSIG on the driver never reached) dies with this job,
    however the job ends; a machine without one gets no header (SandboxError), never a build that
    could be orphaned. Off the timed CPUs where there are others; the job's own nice 19 is inherited."""
    # Only the folder being checked on CPATH; the worker's PATH, so ``c++`` is the compiler load_inline finds.
    env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C", "LC_ALL": "C", **(extra_env or {})}
    limits = SandboxLimits(wall_s=BUILD_TIMEOUT_S, memory_mb=BUILD_MEMORY_MB, max_file_mb=BUILD_FILE_MB,
                           max_output_chars=BUILD_OUTPUT_CHARS, cpus=tuple(cpus or ()), required_isolation=("pidns",))
    return run_sandboxed(cmd, b"", cwd, limits, env=env, inherit_env=False)


def _ended(outcome: SandboxOutcome) -> str:
    if outcome.failure in ("timeout", "out_of_memory"):
        return {"timeout": f"over {BUILD_TIMEOUT_S:.0f} s", "out_of_memory": f"over {BUILD_MEMORY_MB} MB"}[outcome.failure]
    return f"signal {outcome.signal_name}" if outcome.signal_name else f"exit {outcome.returncode}"


def _say(line: str) -> None:
    """A line of the job's log (``<key>.log`` beside the folder: its stdout)."""
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} inline_pch job {os.getpid()}: {line}", flush=True)


def run_job(folder: Path, recipe: dict, lock_fd: int | None, cpus: list[int] | None) -> int:
    """The detached job (``start_job``): build ``folder`` under the lock its starter handed over, then exit.

    The lock stays held until this process ends (the descriptor is never closed; the sandboxed
    compilers do not inherit it). Started by hand, without ``--lock-fd``, it takes the lock itself.
    """
    if lock_fd is None:
        lock_fd = os.open(folder.parent / f"{folder.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a no-op on the starter's lock, which is ours too
    except BlockingIOError:
        _say("another job holds the lock: nothing to do")
        return 0
    os.nice(19)  # inherited by every compiler: the header is a convenience, never ahead of an evaluation
    _say(f"started for {folder}")
    built = _build_locked(folder, recipe["compiler"], list(recipe["flags"]), Path(recipe["header"]), cpus)
    return 0 if built else 1


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m env_pool.build.inline_pch",
                                     description="Build the precompiled torch/extension.h for load_inline builds.")
    parser.add_argument("root", help="the pch folder (env.pch_dir); with --job, the key's own folder in it")
    parser.add_argument("backend", nargs="?", choices=["cpp", "cuda"], default="cpp")
    parser.add_argument("--job", metavar="RECIPE", help="run as the detached job start_job starts: the compiler, "
                        "flags and header as JSON")
    parser.add_argument("--lock-fd", type=int, help="the inherited, already locked lock file")
    parser.add_argument("--cpus", help="comma-separated CPUs for the compilers")
    args = parser.parse_args(argv)
    cpus = [int(c) for c in args.cpus.split(",")] if args.cpus else None
    if args.job:
        return run_job(Path(args.root), json.loads(args.job), args.lock_fd, cpus)
    compiler, flags, key = target(args.backend == "cuda")  # in the foreground, its lock taken here
    dest = Path(args.root).expanduser() / key
    ok = build(dest, compiler, flags, cpus)
    print(dest, "ok" if ok else (dest / "failed").read_text() if (dest / "failed").exists() else "busy: a job builds it")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
