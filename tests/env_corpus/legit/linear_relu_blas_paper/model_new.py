"""Linear + ReLU: the GEMM in a BLAS library, the bias and ReLU in this solution's own kernel (allowed
by the paper's rules, a library fallback under the strict ones). nn.Linear kept for its weights."""
import ctypes
import os

import numpy  # noqa: F401  (its OpenBLAS is the BLAS the kernel finds among the loaded objects)
import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.linear_relu_forward.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3
_lib.linear_relu_forward.restype = ctypes.c_int


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        m, k = x.shape
        n = self.linear.out_features
        y = torch.empty(m, n, dtype=x.dtype)
        if _lib.linear_relu_forward(x.data_ptr(), self.linear.weight.data_ptr(), self.linear.bias.data_ptr(),
                                    y.data_ptr(), m, k, n):
            raise RuntimeError("no BLAS library is loaded in this process")
        return y
