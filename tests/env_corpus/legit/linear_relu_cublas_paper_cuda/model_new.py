"""Linear + ReLU: the GEMM in cuBLAS, the bias and ReLU in this solution's own kernel (allowed by the
paper's rules, a library fallback under the strict ones). nn.Linear kept for its weights."""
import ctypes
import os

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.linear_relu_cublas.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_void_p]
_lib.linear_relu_cublas.restype = ctypes.c_int


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        m, k = x.shape
        n = self.linear.out_features
        y = torch.empty(m, n, dtype=x.dtype, device=x.device)
        err = _lib.linear_relu_cublas(x.data_ptr(), self.linear.weight.data_ptr(), self.linear.bias.data_ptr(),
                                      y.data_ptr(), m, k, n, torch.cuda.current_stream().cuda_stream)
        if err:
            raise RuntimeError(f"linear_relu_cublas failed: {err}")
        return y
