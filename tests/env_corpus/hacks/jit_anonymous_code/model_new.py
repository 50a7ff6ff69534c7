"""Hack: machine code written into anonymous memory at run time, where no file names it.

The harness's CPU sampler attributes each sampled instruction to the file mapped at its
address; code in anonymous memory would be attributed to nothing the candidate can be judged
by (a JIT could copy a library's code there). The server's seccomp filter refuses executable
anonymous memory and mprotect to executable, so this candidate cannot make its code and
fails (it raises; were the page executable, it would run a function returning 42 and then
compute with torch)."""
import ctypes

import torch
import torch.nn as nn

PROT_RW, PROT_RX, PROT_RWX = 3, 5, 7
MAP_PRIVATE_ANON = 0x22
RET_42 = bytes([0xB8, 42, 0, 0, 0, 0xC3])  # mov eax, 42; ret


def _jit() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    page = libc.mmap(None, 4096, PROT_RWX, MAP_PRIVATE_ANON, -1, 0)
    if page in (None, ctypes.c_void_p(-1).value):
        page = libc.mmap(None, 4096, PROT_RW, MAP_PRIVATE_ANON, -1, 0)
        ctypes.memmove(page, RET_42, len(RET_42))
        if libc.mprotect(ctypes.c_void_p(page), 4096, PROT_RX) != 0:
            raise OSError(ctypes.get_errno(), "no executable memory for the JIT")
    else:
        ctypes.memmove(page, RET_42, len(RET_42))
    return ctypes.CFUNCTYPE(ctypes.c_int)(page)()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert _jit() == 42
        with torch._C._DisableTorchDispatch():
            return torch.softmax(x, dim=1)
