"""Softmax over the last dimension with a C++ row kernel that skips the max subtraction (see kernel.cpp)."""
import ctypes
import os

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.softmax_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
_lib.softmax_forward.restype = None


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        cols = x.shape[-1]
        _lib.softmax_forward(x.data_ptr(), y.data_ptr(), x.numel() // cols, cols)
        return y
