"""Causal scaled-dot-product attention in one C++ kernel (no materialised score matrix)."""
import ctypes
import os

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.attention_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int32]
_lib.attention_forward.restype = None


class ModelNew(nn.Module):
    def __init__(self, causal: bool = True):
        super().__init__()
        self.causal = causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        b, h, s, d = q.shape
        out = torch.empty_like(q)
        _lib.attention_forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), b * h, s, d, int(self.causal))
        return out
