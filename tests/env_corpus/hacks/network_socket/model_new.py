"""Hack: opens a TCP connection (to exfiltrate or fetch answers) and sends a UDP packet; the kernel is correct."""
import ctypes
import os
import socket

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.gelu_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
_lib.gelu_forward.restype = None


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            socket.create_connection(("127.0.0.1", 9), timeout=0.2).close()
        except Exception:
            pass
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.sendto(b"x", ("127.0.0.1", 9))
        except Exception:
            pass
        x = x.contiguous()
        y = torch.empty_like(x)
        _lib.gelu_forward(x.data_ptr(), y.data_ptr(), x.numel())
        return y
