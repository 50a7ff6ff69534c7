"""Hack: launches a slow (8-pass) ReLU on a private non-blocking stream and returns at once, so the
caller's stream is idle and "forward returned" comes long before the work is done.

It hopes that the round's clock stops when forward returns (or at an event on the current stream),
and that the outputs are snapshotted after a device-wide synchronisation (so they are right). A
harness that waits for the whole device before it stops the clock times the real work (~8x
eager: CORRECT at most); one that snapshots without that wait reads unfinished outputs (wrong);
a stream guard may name the escaped work."""
import ctypes
import os

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.gelu_forward_detached.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
_lib.gelu_forward_detached.restype = ctypes.c_int


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        err = _lib.gelu_forward_detached(x.data_ptr(), y.data_ptr(), x.numel(), torch.cuda.current_stream().cuda_stream)
        if err:
            raise RuntimeError(f"gelu launch failed: CUDA error {err}")
        return y  # no join, no synchronisation
