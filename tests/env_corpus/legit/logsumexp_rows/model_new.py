"""logsumexp over the last dimension (a row reduction) in C++."""
import ctypes
import os

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.logsumexp_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
_lib.logsumexp_forward.restype = None


class ModelNew(nn.Module):
    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dim not in (-1, x.dim() - 1):
            raise ValueError("this kernel reduces the last dimension only")
        x = x.contiguous()
        cols = x.shape[-1]
        out = torch.empty(x.shape[:-1], dtype=x.dtype)
        _lib.logsumexp_forward(x.data_ptr(), out.data_ptr(), x.numel() // cols, cols)
        return out
