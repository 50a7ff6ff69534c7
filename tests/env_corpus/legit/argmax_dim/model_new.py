"""argmax along one dimension, int64 output, in C++."""
import ctypes
import os

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.argmax_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
_lib.argmax_forward.restype = None


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        d = self.dim % x.dim()
        outer = 1
        for s in x.shape[:d]:
            outer *= s
        inner = 1
        for s in x.shape[d + 1:]:
            inner *= s
        out = torch.empty(tuple(x.shape[:d]) + tuple(x.shape[d + 1:]), dtype=torch.int64)
        _lib.argmax_forward(x.data_ptr(), out.data_ptr(), outer, x.shape[d], inner)
        return out
