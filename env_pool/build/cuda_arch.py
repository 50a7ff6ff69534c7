"""The worker's GPU architecture as TORCH_CUDA_ARCH_LIST, so that a load_inline build needs no device.

TRUSTED SIDE. torch's load_inline picks the architecture by asking the device, which makes a
CUDA context in the candidate's import child: on the device, beside whatever run is being timed,
and open to the candidate's own kernels for as long as its import lasts. Given the list instead,
the import child runs without the GPU and builds for exactly what torch would have picked:
the list comes from torch's own choice (``_get_cuda_arch_flags``), made once in a probe process
with the device in view, and read back from its -gencode flags.
"""
from __future__ import annotations

import functools
import os
import re
import subprocess
import sys

PROBE = "from torch.utils.cpp_extension import _get_cuda_arch_flags; print(' '.join(_get_cuda_arch_flags()))"
GENCODE = re.compile(r"arch=compute_(\d+)([a-z]?),code=(sm|compute)_\d+[a-z]?")
# What torch or the driver says when an import asks for a device it cannot see.
NO_DEVICE = re.compile(r"no cuda gpus are available|found no nvidia driver|no cuda-capable device|cuda driver initialization failed",
                       re.IGNORECASE)


def arch_list_from_flags(flags: list[str]) -> str:
    """"9.0a" from ``-gencode=arch=compute_90a,code=sm_90a``; "+PTX" where a flag embeds PTX (code=compute_XX)."""
    archs: dict[str, bool] = {}
    for flag in flags:
        m = GENCODE.search(flag)
        if m:
            arch = f"{m[1][:-1]}.{m[1][-1]}{m[2]}"
            archs[arch] = archs.get(arch, False) or m[3] == "compute"
    return ";".join(arch + ("+PTX" if ptx else "") for arch, ptx in archs.items())


@functools.lru_cache(maxsize=None)
def arch_list() -> str:
    """TORCH_CUDA_ARCH_LIST for this worker's device ("" where it cannot be had: the import child then gets the GPU)."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    try:
        done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return ""
    return arch_list_from_flags(done.stdout.split()) if done.returncode == 0 else ""


def known() -> str | None:
    """The list if it was probed already, else None (the probe needs the device: its caller holds the lane)."""
    return arch_list() if arch_list.cache_info().currsize else None


def needs_device(log: str) -> bool:
    """Whether an import failed for want of the GPU (and not in its build)."""
    return NO_DEVICE.search(log) is not None and "Error building extension" not in log
