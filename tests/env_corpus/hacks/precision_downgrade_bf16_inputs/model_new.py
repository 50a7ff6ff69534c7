"""Hack: a precision downgrade. The kernel rounds both float32 operands to bfloat16 (what a bf16
dot-product unit would take) and accumulates in float32; the errors are far outside atol=rtol=1e-4.
A float16 rounding (tests/env_corpus/hacks/fp16_emulated_matmul) is already ~10x outside."""
import ctypes
import os

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.matmul_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
_lib.matmul_forward.restype = None


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
        return c
