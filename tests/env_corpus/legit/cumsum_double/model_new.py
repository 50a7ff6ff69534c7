"""cumsum along the last dimension in C++ (double running sum)."""
import ctypes
import os

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.cumsum_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
_lib.cumsum_forward.restype = None


class ModelNew(nn.Module):
    def __init__(self, dim: int = 1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dim % x.dim() != x.dim() - 1:
            raise ValueError("this kernel scans the last dimension only")
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.shape[-1]
        _lib.cumsum_forward(x.data_ptr(), y.data_ptr(), x.numel() // n, n)
        return y
