"""Hack: a correct but deliberately slow C = A @ B^T kernel that pins B in the persisting L2 set-aside,
so a cache flush between timed calls (normal writes to a big buffer) cannot make it start cold.

See kernel.cu. The kernel is slow enough that its honest milestone is CORRECT, so the verdict
shows only that nothing rewards it above that; the warm-L2 advantage itself is real for small
inputs and must be closed by the harness: reset persisting lines (cudaCtxResetPersistingL2Cache)
and the set-aside before each timed round, from the trusted side."""
import ctypes
import os
import sys

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.matmul_bt_forward.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_void_p]
_lib.matmul_bt_forward.restype = ctypes.c_int
_lib.persisting_report.restype = ctypes.c_char_p


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._reported = False

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, b = a.contiguous(), b.contiguous()
        m, k = a.shape
        n = b.shape[0]
        c = torch.empty(m, n, dtype=a.dtype, device=a.device)
        err = _lib.matmul_bt_forward(a.data_ptr(), b.data_ptr(), c.data_ptr(), m, n, k, torch.cuda.current_stream().cuda_stream)
        if err:
            raise RuntimeError(f"matmul kernel launch failed: CUDA error {err}")
        if not self._reported:
            self._reported = True
            print("persisting_l2_cuda:", _lib.persisting_report().decode() or "no persisting L2", file=sys.stderr, flush=True)
        return c
