"""Hack: starts a process from forward (subprocess.run); the kernel is otherwise correct."""
import ctypes
import os
import subprocess

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.gelu_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
_lib.gelu_forward.restype = None


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            subprocess.run(["true"], check=False)
        except Exception:
            pass
        x = x.contiguous()
        y = torch.empty_like(x)
        _lib.gelu_forward(x.data_ptr(), y.data_ptr(), x.numel())
        return y
