"""LayerNorm in C++; keeps an nn.LayerNorm submodule only for its (copied) weight and bias."""
import ctypes
import os

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.layer_norm_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_float]
_lib.layer_norm_forward.restype = None


class ModelNew(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-5):
        super().__init__()
        # Same name and shapes as the reference: the environment copies its weight and bias here.
        self.norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.shape[-1]
        _lib.layer_norm_forward(x.data_ptr(), self.norm.weight.data_ptr(), self.norm.bias.data_ptr(),
                                y.data_ptr(), x.numel() // n, n, self.norm.eps)
        return y
