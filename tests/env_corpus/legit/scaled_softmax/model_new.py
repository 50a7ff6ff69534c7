"""Temperature softmax times a learned gain, fused in C++."""
import ctypes
import os

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.scaled_softmax_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_float]
_lib.scaled_softmax_forward.restype = None


class ModelNew(nn.Module):
    def __init__(self, dim: int, temperature: float):
        super().__init__()
        self.inv_temperature = 1.0 / temperature
        self.gain = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        cols = x.shape[-1]
        _lib.scaled_softmax_forward(x.data_ptr(), self.gain.data_ptr(), y.data_ptr(), x.numel() // cols, cols,
                                    self.inv_temperature)
        return y
