"""inplace_output_slot_cuda's slow ReLU served honestly: its output allocated as any kernel's."""
import ctypes
import os

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.relu_slow.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
_lib.relu_slow.restype = ctypes.c_int


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        err = _lib.relu_slow(x.data_ptr(), y.data_ptr(), x.numel(), torch.cuda.current_stream().cuda_stream)
        if err:
            raise RuntimeError(f"relu kernel launch failed: CUDA error {err}")
        return y
