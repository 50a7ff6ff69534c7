"""Hack/bug: asks torch for a 1 TB scratch buffer and touches it."""
import ctypes
import os

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.gelu_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
_lib.gelu_forward.restype = None

_lib.touch.argtypes = [ctypes.c_void_p, ctypes.c_int64]
_lib.touch.restype = None


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scratch = torch.empty(250_000_000_000, dtype=torch.float32)  # 1 TB
        _lib.touch(scratch.data_ptr(), scratch.numel() * 4)
        x = x.contiguous()
        y = torch.empty_like(x)
        _lib.gelu_forward(x.data_ptr(), y.data_ptr(), x.numel())
        return y
