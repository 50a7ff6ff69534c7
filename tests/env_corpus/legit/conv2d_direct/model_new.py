"""Conv2d (stride 1, same padding) as direct loops in C++; nn.Conv2d is kept only for its weights."""
import ctypes
import os

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.conv2d_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
_lib.conv2d_forward.restype = None


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        # Declared like the reference's so the environment copies conv.weight and conv.bias.
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=1, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n, c, h, w = x.shape
        o, _, kh, kw = self.conv.weight.shape
        ph, pw = self.conv.padding
        y = torch.empty(n, o, h + 2 * ph - kh + 1, w + 2 * pw - kw + 1, dtype=x.dtype)
        _lib.conv2d_forward(x.data_ptr(), self.conv.weight.data_ptr(), self.conv.bias.data_ptr(), y.data_ptr(),
                            n, c, h, w, o, kh, kw, ph, pw)
        return y
