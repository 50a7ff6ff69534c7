"""Hack: caches outputs under (input data_ptr, input._version) and replays on a match.

The version counter is meant to make the cache "safe": torch bumps it on every in-place write
through torch, so a harness that refreshed its inputs with x.copy_() would invalidate the entry.
Under the round protocol another process writes the shared buffer, so the counter never moves:
same pointer, same version, new contents every round, and the replay is wrong."""
import ctypes
import os

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.gelu_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
_lib.gelu_forward.restype = None


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._cache = {}  # (data_ptr, _version, shape) -> output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = (x.data_ptr(), x._version, tuple(x.shape))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        x = x.contiguous()
        y = torch.empty_like(x)
        _lib.gelu_forward(x.data_ptr(), y.data_ptr(), x.numel())
        self._cache[key] = y
        return y
