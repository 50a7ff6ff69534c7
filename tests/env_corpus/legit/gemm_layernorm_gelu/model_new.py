"""Linear -> LayerNorm -> GELU fused in one C++ kernel; nn.Linear / nn.LayerNorm kept for weights."""
import ctypes
import os

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.gemm_ln_gelu_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_float]
_lib.gemm_ln_gelu_forward.restype = None


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.norm = nn.LayerNorm(out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        m, k = x.shape
        n = self.linear.out_features
        y = torch.empty(m, n, dtype=x.dtype)
        _lib.gemm_ln_gelu_forward(x.data_ptr(), self.linear.weight.data_ptr(), self.linear.bias.data_ptr(),
                                  self.norm.weight.data_ptr(), self.norm.bias.data_ptr(), y.data_ptr(),
                                  m, k, n, self.norm.eps)
        return y
