"""nvcc for a load_inline build's kernel file: torch's tensor API first, its whole C++ API only if needed.

UNTRUSTED SIDE: this runs inside the candidate's import child, as the nvcc of its own
``load_inline`` build. It decides nothing but how fast that build goes.

KernelBench's ``cuda_sources`` start with ``#include <torch/extension.h>``: torch's whole C++
frontend and pybind11, which nvcc parses three times (cudafe++'s host pass, cicc's device pass,
gcc's host compile). On the H100 machine (``nvcc -time``) that was 74 of the file's 80 s; with
``torch/types.h`` in its place (torch::Tensor, ATen's ops, TORCH_CHECK, the dispatch macros:
what a kernel's launcher uses) the file took 39 s. The binding (pybind11) is load_inline's
main.cpp, which g++ compiles against the precompiled header (env_pool/inline_pch.py).

So the import child's torch is given a view of the CUDA toolkit (``install``) whose bin/nvcc
runs ``main`` here: a kernel file is compiled twice at once, once with ``-I LIGHT`` (where
torch/extension.h is torch/types.h) and once as given. The light object is kept if it builds;
otherwise the full build's result and messages are the build's, so an error the agent reads
is always the full header's own, and a file that needs more than torch/types.h costs nothing
extra in wall time. The sources are never changed.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

LIGHT = Path(__file__).resolve().parent / "light_headers"  # holds the light torch/extension.h


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


def light_args(args: list[str]) -> tuple[list[str], str, str] | None:
    """(the light build's arguments, its output, the output it stands for); None where this is not a .cu compile."""
    if "-c" not in args or not any(a.endswith(".cu") for a in args) or "-o" not in args:
        return None
    out = args[args.index("-o") + 1]
    light = [a if a != out else f"{out}.light" for a in args]
    if "--dependency-output" in light:  # torch's rule: --generate-dependencies-with-compile --dependency-output $out.d
        at = light.index("--dependency-output") + 1
        light[at] = f"{out}.light.d"
    return ["-I", str(LIGHT), *light], f"{out}.light", out  # first: it must win over any -I of the build


def main(argv: list[str]) -> int:
    real, args = argv[0], argv[1:]
    plan = light_args(args)
    if plan is None:
        os.execv(real, [real, *args])
    light, light_out, out = plan
    full = subprocess.Popen([real, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    quick = subprocess.run([real, *light], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if quick.returncode == 0:
        os.killpg(full.pid, signal.SIGKILL)
        full.wait()
        _settle(light_out, out, args)
        sys.stdout.buffer.write(quick.stdout)
        return 0
    for leftover in (light_out, f"{light_out}.d"):
        Path(leftover).unlink(missing_ok=True)
    log, _ = full.communicate()
    sys.stdout.buffer.write(log)
    return full.returncode


def _settle(light_out: str, out: str, args: list[str]) -> None:
    """The light object becomes the build's, its dependency file renamed to name the real output."""
    os.replace(light_out, out)
    if "--dependency-output" in args:
        deps = Path(args[args.index("--dependency-output") + 1])
        light_deps = Path(f"{light_out}.d")
        text = light_deps.read_text()  # "cuda.cuda.o.light : cuda.cu ...": ninja checks the target's name
        deps.write_text(out + text[len(light_out):] if text.startswith(light_out) else text)
        light_deps.unlink()


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

