"""A server's round allocations on a GPU, served from the arena the harness shares with it.

UNTRUSTED SIDE (used by env_pool/candidate/serve.py): it runs in the server's process, in the candidate's
reach, and the harness believes nothing of it. It exists so that a round's outputs need no copy
in the server: every allocation the server's forward makes on its thread (the reference's
outputs, a candidate's ``torch.empty_like``, temporaries) comes from the arena, a part of the
round memory that the harness maps too (env_pool/shared/rounds.py), and the harness reads each output
where it lies (env_pool/trusted/readout.py). A copy the server made would be one a candidate could skip
by writing into protocol memory itself; here the reference pays for none, and neither does a
candidate's ordinary output.

How: a torch ``MemPool`` whose allocator hands out pieces of the arena (first fit, freed pieces
merged back); what does not fit comes from the driver (``cuMemAlloc``), and an output that
lies there is copied into the arena by the server (a copy charged to that round). torch's
caching allocator keeps the pool's blocks for the next round, so after the first round the
allocator is rarely called. The callbacks are ctypes functions, made before any candidate code
loads (their trampolines are executable memory, which the seccomp filter refuses later).
"""
from __future__ import annotations

import bisect
import contextlib
import ctypes
from typing import Iterator

import torch

ALIGN = 512  # the caching allocator's own block granularity
LARGE = 1 << 20  # requests of this size or more start on a 2 MiB boundary, as cudaMalloc's would
LARGE_ALIGN = 2 << 20

_ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)


class Pieces:
    """First-fit pieces of ``[0, size)`` at an address ``base``: taken aligned, given back and merged."""

    def __init__(self, base: int, size: int):
        self.base, self.size = base, size
        self.free: list[tuple[int, int]] = [(0, size)]  # (offset, length), sorted by offset
        self.used: dict[int, int] = {}  # offset -> length

    def take(self, size: int) -> int | None:
        """The offset of a new piece of ``size`` bytes, or None when none is free."""
        align = LARGE_ALIGN if size >= LARGE else ALIGN
        for k, (offset, length) in enumerate(self.free):
            start = -(-(self.base + offset) // align) * align - self.base
            if start + size <= offset + length:
                del self.free[k]
                if start > offset:
                    bisect.insort(self.free, (offset, start - offset))
                if start + size < offset + length:
                    bisect.insort(self.free, (start + size, offset + length - start - size))
                self.used[start] = size
                return start
        return None

    def give(self, offset: int) -> bool:
        """Return the piece at ``offset``; False if it is not one of these."""
        length = self.used.pop(offset, None)
        if length is None:
            return False
        k = bisect.bisect(self.free, (offset, length))
        self.free.insert(k, (offset, length))
        if k + 1 < len(self.free) and offset + length == self.free[k + 1][0]:  # merge right, then left
            length += self.free.pop(k + 1)[1]
            self.free[k] = (offset, length)
        if k > 0 and self.free[k - 1][0] + self.free[k - 1][1] == offset:
            prev = self.free.pop(k - 1)
            self.free[k - 1] = (prev[0], prev[1] + length)
        return True


class Arena:
    """Pieces of ``[base, base + size)`` for torch's caching allocator, as a MemPool to allocate into."""

    def __init__(self, base: int, size: int):
        self.base, self.size = base, size
        self.pieces = Pieces(base, size)
        self.outside: dict[int, int] = {}  # pointers from the driver, when the arena was full
        self._cuda = ctypes.CDLL("libcuda.so.1")
        self._alloc_fn, self._free_fn = _ALLOC(self._alloc), _FREE(self._free)  # kept: torch holds their addresses
        allocator = torch._C._cuda_customAllocator(ctypes.cast(self._alloc_fn, ctypes.c_void_p).value,
                                                   ctypes.cast(self._free_fn, ctypes.c_void_p).value)
        self.pool = torch.cuda.MemPool(allocator)

    @contextlib.contextmanager
    def allocating(self) -> Iterator[None]:
        """This thread's CUDA allocations come from the arena meanwhile."""
        with torch.cuda.use_mem_pool(self.pool):
            yield

    def offset_of(self, tensor: torch.Tensor) -> int | None:
        """Where ``tensor``'s data starts in the arena, or None when it lies elsewhere."""
        offset = tensor.data_ptr() - self.base
        nbytes = tensor.numel() * tensor.element_size()
        return offset if 0 <= offset and offset + nbytes <= self.size else None

    def _alloc(self, size: int, device: int, stream: int) -> int:
        offset = self.pieces.take(size)
        if offset is not None:
            return self.base + offset
        ptr = ctypes.c_uint64()
        if self._cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)) != 0:
            return 0  # torch raises its out-of-memory error
        self.outside[ptr.value] = size
        return ptr.value

    def _free(self, ptr: int, size: int, device: int, stream: int) -> None:
        if self.outside.pop(ptr, None) is not None:
            self._cuda.cuMemFree_v2(ctypes.c_uint64(ptr))
        else:
            self.pieces.give(ptr - self.base)
