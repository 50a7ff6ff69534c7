"""Batched matmul (bmm) in C++."""
import ctypes
import os

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.bmm_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
_lib.bmm_forward.restype = None


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a = a.contiguous()
        b = b.contiguous()
        batch, m, k = a.shape
        n = b.shape[2]
        c = torch.empty(batch, m, n, dtype=a.dtype)
        _lib.bmm_forward(a.data_ptr(), b.data_ptr(), c.data_ptr(), batch, m, n, k)
        return c
