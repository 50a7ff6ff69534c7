"""The harness reads a round's outputs where the server's forward left them, with the server frozen.

TRUSTED SIDE (used by env_pool/trusted/harness.py). The server writes, for each output, where it lies
(rounds.OUTS words: untrusted numbers); nothing of the output passes through a copy the
server makes, so there is no copy the candidate can skip (see env_pool/shared/rounds.py). What is
read is checked like any output; a location that cannot be read fails the round.

- CPU: ``process_vm_readv`` from the server's address space. The server is frozen (its cgroup,
  env_pool/isolation/cgroups.py's Freezer) from its DONE until this returns, so nothing it does can
  change what is read, or race the read. The kernel refuses an address outside its mappings
  (EFAULT); the candidate's seccomp filter refuses ``userfaultfd``, so no page of it can make
  this read wait on the frozen process.
- GPU: from the arena (the shared allocation's part where the server's round allocates), by
  offset, checked against the arena's bounds, in pieces copied in a random order. The host is
  frozen, but device work it queued may still run: contexts of two processes take turns on a
  GPU (no MPS), and the random order means a kernel still writing its output when the copy
  starts leaves unfinished pieces to be read, which fails verification, instead of staying
  ahead of a copy in address order.
"""
from __future__ import annotations

import ctypes
import errno
import os
import random

import torch

PIECES = 16  # a GPU output is read in this many pieces, in a random order
MIN_PIECE = 1 << 20  # bytes: smaller outputs are read whole


class Unreadable(Exception):
    """An output's location does not hold readable memory of the right size: the round fails as wrong."""


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.POINTER(_IoVec),
                                   ctypes.c_ulong, ctypes.c_ulong]
_libc.process_vm_readv.restype = ctypes.c_ssize_t


def read_process(pid: int, address: int, into: torch.Tensor) -> None:
    """``into.nbytes`` bytes at ``address`` of process ``pid`` into the contiguous CPU tensor ``into``."""
    total = into.numel() * into.element_size()
    done = 0
    while done < total:
        local = _IoVec(into.data_ptr() + done, total - done)
        remote = _IoVec(address + done, total - done)
        got = _libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got <= 0:
            err = ctypes.get_errno()
            if err == errno.ESRCH:
                raise ProcessLookupError(f"the server (pid {pid}) is gone")
            raise Unreadable(f"{total} bytes at {address:#x} are not readable memory of the server "
                             f"({os.strerror(err) if err else 'nothing read'})")
        done += got


def read_arena(arena: torch.Tensor, offset: int, into: torch.Tensor) -> None:
    """``into.nbytes`` bytes at ``offset`` of the arena (a device byte tensor) into ``into``, in pieces, in a random order."""
    total = into.numel() * into.element_size()
    if not (0 <= offset and offset + total <= arena.numel()):
        raise Unreadable(f"{total} bytes at offset {offset} lie outside the arena ({arena.numel()} bytes)")
    src = arena[offset:offset + total]
    dst = into.view(-1).view(torch.uint8)
    piece = max(MIN_PIECE, -(-total // PIECES))
    starts = list(range(0, total, piece))
    random.SystemRandom().shuffle(starts)
    for start in starts:
        dst[start:start + piece].copy_(src[start:start + piece])
