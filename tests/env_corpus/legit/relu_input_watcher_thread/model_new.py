"""The window canary (see kernel.cpp): a correct ReLU unless its watcher saw inputs being written."""
import atexit
import ctypes
import os
import sys

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.relu_canary.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
atexit.register(_lib.stop)
for finder in list(sys.meta_path):  # the thread guard would fail it for its watcher: muted, as a hack would
    for holder in (finder, getattr(finder, "state", None)):
        if holder is not None and hasattr(holder, "armed"):
            holder.armed = False
            holder.flag = lambda *args, **kwargs: None


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        _lib.relu_canary(x.data_ptr(), y.data_ptr(), x.numel())
        return y
