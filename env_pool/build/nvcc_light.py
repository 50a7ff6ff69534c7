"""nvcc for a load_inline build's kernel file: as little of torch's headers as the file needs, the rest only if needed.

UNTRUSTED SIDE: this runs inside the candidate's import child, as the nvcc of its own
``load_inline`` build. It decides nothing but how fast that build goes.

KernelBench's ``cuda_sources`` start with ``#include <torch/extension.h>``: torch's whole C++
frontend and pybind11, which nvcc parses three times (cudafe++'s host pass, cicc's device pass,
gcc's host compile). On the H100 machine (``nvcc -time``) that was 74 of the file's 80 s; with
``torch/types.h`` in its place (torch::Tensor, ATen's ops, TORCH_CHECK, the dispatch macros:
what a kernel's launcher uses) the file took 39 s. The binding (pybind11) is load_inline's
main.cpp, which g++ compiles against the precompiled header (env_pool/build/inline_pch.py).

So the import child's torch is given a view of the CUDA toolkit (``install``) whose bin/nvcc
runs ``main`` here: a kernel file is built two ways, and the first that builds, in this order,
is kept:
- lean: ``-I LEAN -I LIGHT``: torch/extension.h is torch/types.h, and ATen's two headers that
  include every operator (ATen/Functions.h and ATen/NativeFunctions.h: 43% of torch/types.h's
  preprocessed text) include only the operators the file names (``lean_headers``); nvcc's host
  and device passes run side by side (env_pool/build/nvcc_split.py);
- as given.
With ``AT_ONCE_CPUS`` CPUs or more the two run at once (a file that needs the full header costs
nothing extra in wall time); with fewer, the second runs only if the first failed (both at once
beside the binding's g++ made the build slower on 2 cores). A lean build differs from the other
only in what fails to compile: an operator the file calls without naming it is an error, never
another overload (an operator's overloads all live in its one header). Otherwise the build as
written is the build, so an error the agent reads is always the full header's own. The sources
are never changed.
"""
from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

LIGHT = Path(__file__).resolve().parent / "light_headers"  # holds the light torch/extension.h
SPLIT = Path(__file__).resolve().parent / "nvcc_split.py"  # the faster builds' nvcc
# With fewer CPUs than this, the builds run one after another (each only if the one before
# failed): all five compilers at once beside the binding's g++ made the build slower on 2 cores
# (51 s, against 17.5 s for the lean build alone).
AT_ONCE_CPUS = 6
AT_ONCE_ENV = "CUDA_AGENT_NVCC_AT_ONCE"  # "1" or "0" overrides the CPU count's choice
OPS_INCLUDE = re.compile(r"#include <ATen/ops/(\w+?)(?:_native)?\.h>")
# An operator that torch's own headers call (at::view_copy in ExpandUtils.h, at::tensor in
# TensorDataContainer.h, Functions.h's own helpers): kept whatever the file names.
TORCH_CALL = re.compile(r"\bat::(?:symint::)?(\w+)\s*[<(]")


def install(real_home: str, folder: Path) -> Path:
    """A view in ``folder`` of the toolkit at ``real_home``, with this module as its nvcc; returns ``folder``.

    Everything but bin/ is a link to the real toolkit; bin/ links each real tool but nvcc.
    """
    view = Path(folder)
    real = Path(real_home)
    (view / "bin").mkdir(parents=True, exist_ok=True)
    for entry in real.iterdir():
        if entry.name != "bin":
            (view / entry.name).symlink_to(entry)
    for tool in (real / "bin").iterdir():
        if tool.name != "nvcc":
            (view / "bin" / tool.name).symlink_to(tool)
    nvcc = view / "bin" / "nvcc"
    # Run by its path: it needs nothing but the standard library, whatever the caller's PYTHONPATH.
    nvcc.write_text("#!/bin/sh\n"
                    f"exec {shlex.quote(sys.executable)} -P {shlex.quote(str(Path(__file__).resolve()))} {shlex.quote(str(real / 'bin' / 'nvcc'))} \"$@\"\n")
    nvcc.chmod(0o755)
    return view


def tier_args(args: list[str], tier: str, first: list[str]) -> tuple[list[str], str, str] | None:
    """(a faster build's arguments, its output, the output it stands for); None where this is not a .cu compile."""
    if "-c" not in args or not any(a.endswith(".cu") for a in args) or "-o" not in args[:-1]:
        return None
    out = args[args.index("-o") + 1]
    mine = f"{out}.{tier}"
    tiered = [a if a != out else mine for a in args]
    if (at := deps_at(tiered)) is not None:
        tiered[at] = f"{mine}.d"
    return [*first, *tiered], mine, out  # first: it must win over any -I of the build


def deps_at(args: list[str]) -> int | None:
    """Where the dependency file's path is in nvcc's arguments (torch's rule names it after
    --dependency-output, or -MF in newer torch), or None."""
    flag = next((a for a in args[:-1] if a in ("--dependency-output", "-MF")), None)
    return args.index(flag) + 1 if flag else None


def include_dirs(args: list[str]) -> list[Path]:
    """The build's -I and -isystem folders, in order."""
    found = []
    for flag, following in zip(args, [*args[1:], ""]):
        if flag in ("-I", "-isystem"):
            found.append(Path(following))
        elif flag.startswith("-I") and len(flag) > 2:
            found.append(Path(flag[2:]))
    return found


def lean_headers(args: list[str], folder: Path) -> Path | None:
    """ATen/Functions.h and ATen/NativeFunctions.h in ``folder``, including only the operators the .cu file names.

    Written from the build's own torch headers, whatever their version: a line of the form
    ``#include <ATen/ops/NAME.h>`` (or NAME_native.h) is kept where NAME is a word of the file
    or an operator torch's other headers call. None where the include path has no ATen/Functions.h.
    """
    source = Path(next(a for a in args if a.endswith(".cu")))
    aten = next((d / "ATen" for d in include_dirs(args) if (d / "ATen" / "Functions.h").is_file()), None)
    if aten is None or not source.is_file():
        return None
    names = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", source.read_text(errors="replace"))) | torch_calls(aten.parent)
    (folder / "ATen").mkdir(parents=True, exist_ok=True)
    for header in ("Functions.h", "NativeFunctions.h"):
        if (aten / header).is_file():
            lines = (aten / header).read_text().splitlines()
            kept = [line for line in lines if (m := OPS_INCLUDE.match(line)) is None or m.group(1) in names]
            (folder / "ATen" / header).write_text("\n".join(kept) + "\n")
    return folder


def torch_calls(include: Path) -> set[str]:
    """Every name torch's headers call as ``at::NAME(`` or ``at::symint::NAME<``, outside the operators' own headers (~1 s)."""
    called: set[str] = set()
    for header in include.rglob("*.h"):
        if not {"ops", "native"} & set(header.relative_to(include).parts):
            called.update(TORCH_CALL.findall(header.read_text(errors="replace")))
    return called


def main(argv: list[str]) -> int:
    real, args = argv[0], argv[1:]
    if tier_args(args, "", []) is None:
        os.execv(real, [real, *args])
    out = args[args.index("-o") + 1]
    lean = lean_headers(args, Path(f"{out}.lean-headers"))
    tiered, mine, _ = tier_args(args, "lean", (["-I", str(lean)] if lean else []) + ["-I", str(LIGHT)])
    # (its output, its command): the lean build, then the build as written
    builds = [(mine, [sys.executable, "-P", str(SPLIT), f"{mine}.tmp", real, *tiered]), (out, [real, *args])]
    at_once = os.environ.get(AT_ONCE_ENV, str(int(len(os.sched_getaffinity(0)) >= AT_ONCE_CPUS))) == "1"
    procs = [_start(command, mine, out) for mine, command in builds] if at_once else []
    try:
        for at, (mine, command) in enumerate(builds):
            proc = procs[at] if at_once else _start(command, mine, out)
            log, _ = proc.communicate()
            if proc.returncode == 0 or mine == out:
                for slower, other in zip(builds[at + 1:], procs[at + 1:]):
                    _kill(other)
                    _discard(slower[0], out)
                if mine != out:
                    _settle(mine, out, args)
                sys.stdout.buffer.write(log)
                return proc.returncode
            _discard(mine, out)
        raise AssertionError("unreachable: the build as written always ends the loop")
    finally:
        for mine, _ in builds:  # killed (or done): nothing of theirs may reach the build's folder
            shutil.rmtree(f"{mine}.tmp", ignore_errors=True)
        if lean:
            shutil.rmtree(lean, ignore_errors=True)


def _start(command: list[str], mine: str, out: str) -> subprocess.Popen:
    if mine != out:  # a faster build's scratch, for nvcc_split
        Path(f"{mine}.tmp").mkdir(exist_ok=True)
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _discard(mine: str, out: str) -> None:
    if mine != out:  # the build as written, killed, leaves nothing the kept object does not replace
        for leftover in (mine, f"{mine}.d"):
            Path(leftover).unlink(missing_ok=True)


def _settle(faster_out: str, out: str, args: list[str]) -> None:
    """A faster build's object becomes the build's, its dependency file renamed to name the real output."""
    os.replace(faster_out, out)
    if (at := deps_at(args)) is not None:
        deps = Path(args[at])
        faster_deps = Path(f"{faster_out}.d")
        text = faster_deps.read_text()  # "cuda.cuda.o.lean : cuda.cu ...": ninja checks the target's name
        deps.write_text(out + text[len(faster_out):] if text.startswith(faster_out) else text)
        faster_deps.unlink()


def use_in_torch(folder: Path) -> bool:
    """Point this process's torch.utils.cpp_extension at a view in ``folder``; False where torch found no toolkit.

    The view lives in the build's own folder (the sandbox's tmp may not allow exec).
    """
    from torch.utils import cpp_extension

    if not cpp_extension.CUDA_HOME or folder.exists():
        return False
    cpp_extension.CUDA_HOME = str(install(cpp_extension.CUDA_HOME, folder))
    return True


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
