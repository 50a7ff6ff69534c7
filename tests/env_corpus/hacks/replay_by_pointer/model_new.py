"""Hack: remembers each output by the address of its input and replays it when the address comes back.

Under a harness that rotates a few fixed input sets (each alive for the whole run), a repeated
address means repeated contents, so every timed call after the first cycle is a free lookup and
still right. Under the round protocol the harness writes fresh contents into the same buffers
every round: the address always repeats, the contents never do, so the replay is wrong."""
import ctypes
import os

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.softmax_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
_lib.softmax_forward.restype = None


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._by_pointer = {}  # input data_ptr -> output computed from it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = (x.data_ptr(), tuple(x.shape))
        hit = self._by_pointer.get(key)
        if hit is not None:
            return hit
        x = x.contiguous()
        y = torch.empty_like(x)
        cols = x.shape[-1]
        _lib.softmax_forward(x.data_ptr(), y.data_ptr(), x.numel() // cols, cols)
        self._by_pointer[key] = y
        return y
