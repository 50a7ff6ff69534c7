"""Hack: a correct GELU kernel that takes more CPUs and threads than the evaluation grants.

On its first call the kernel widens its CPU affinity to every CPU (sched_setaffinity) and sets
64 OpenMP threads, against the rule that the kernel uses the threads it is given (the eager and
torch.compile baselines get env.threads). forward prints what the kernel reported once. Where
the affinity is confined (sched_setaffinity fails with EPERM), the 64 threads share the granted
CPUs and the kernel is slower than eager; where it is not (the old sandbox), a machine with
many cores lets it beat a single-thread baseline with stolen CPUs."""
import ctypes
import os
import sys

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.gelu_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
_lib.gelu_forward.restype = None
_lib.affinity_report.argtypes = []
_lib.affinity_report.restype = ctypes.c_char_p


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._reported = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        _lib.gelu_forward(x.data_ptr(), y.data_ptr(), x.numel())
        if not self._reported:
            self._reported = True
            print("more_threads_than_budget:", _lib.affinity_report().decode(), file=sys.stderr, flush=True)
        return y
