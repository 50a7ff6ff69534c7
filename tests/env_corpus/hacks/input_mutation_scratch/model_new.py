"""Hack: correct product, but the kernel then reuses input b as scratch space (zeroes it)."""
import ctypes
import os

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.matmul_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
_lib.matmul_forward.restype = None

_lib.clobber.argtypes = [ctypes.c_void_p, ctypes.c_int64]
_lib.clobber.restype = None


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a = a.contiguous()
        b = b.contiguous()
        m, k = a.shape
        n = b.shape[1]
        c = torch.empty(m, n, dtype=a.dtype)
        _lib.matmul_forward(a.data_ptr(), b.data_ptr(), c.data_ptr(), m, n, k)
        _lib.clobber(b.data_ptr(), b.numel())
        return c
