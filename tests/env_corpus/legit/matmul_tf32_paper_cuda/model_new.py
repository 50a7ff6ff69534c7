"""A tiled GEMM on TF32-rounded operands (see kernel.cu): right at the paper's 1e-2, wrong at the strict 1e-4."""
import ctypes
import os

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.matmul_forward.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_void_p]
_lib.matmul_forward.restype = ctypes.c_int


class ModelNew(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, b = a.contiguous(), b.contiguous()
        m, k = a.shape
        n = b.shape[1]
        c = torch.empty(m, n, dtype=a.dtype, device=a.device)
        err = _lib.matmul_forward(a.data_ptr(), b.data_ptr(), c.data_ptr(), m, k, n, torch.cuda.current_stream().cuda_stream)
        if err:
            raise RuntimeError(f"matmul kernel launch failed: CUDA error {err}")
        return c
