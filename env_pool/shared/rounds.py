"""The memory of the round protocol: a control block, the input slots and, on a GPU, the arena.

The trusted harness (env_pool/trusted/harness.py) and a server (env_pool/candidate/serve.py, sandboxed) map the
same memory. The harness writes each round's fresh inputs into the input slots and a fresh
nonce into ``GO``; the server runs the model, writes where each output lies into the ``OUTS``
words, and writes the nonce into ``DONE``. Both sides spin on these words instead of sleeping
in a pipe read, so a round's overhead is a few microseconds and nearly constant.

Outputs are never copied into protocol memory by the server: a copy made in the candidate's
process is one the candidate can skip (it wrote its result straight into the slot and returned
it, so the server's copy was a move onto itself, while the null phase's copy was still
subtracted: 1.10-1.15x eager for a kernel that moved 1.75x the memory). The harness reads each
output where the server's forward left it (env_pool/trusted/readout.py): on the CPU from the server's
own memory (``process_vm_readv``, the server frozen); on a GPU from the arena, a part of the
shared allocation from which the server's round allocates everything (env_pool/shared/arena.py), so
the reference's output and a candidate's ``torch.empty_like`` land there without a copy.

Deliberately shared across the trust boundary: this module holds only the layout. The server's
copy of it runs in the candidate's reach; the harness relies on nothing the server writes
except as untrusted data (an ``OUTS`` word is an address or an offset it checks and reads from,
and every output it reads is verified).

Memory: the control block is a sealed memfd (the server cannot shrink it under the harness:
a SIGBUS there would turn a hack into an infra failure). Slots live in a second memfd on the
CPU; on a GPU in a CUDA VMM allocation exported as a POSIX file descriptor, because legacy
CUDA IPC handles do not work across PID namespaces and the server runs in one of its own.
Both are passed to the server by inheritance (``run_sandboxed(pass_fds=...)``), and both hold
nothing but the slots and the arena: a server that writes anywhere it can reach touches only
round data.
"""
from __future__ import annotations

import ctypes
import dataclasses
import fcntl
import mmap
import os
from dataclasses import asdict, dataclass
from typing import Any

import torch

# Control words (int64 each) in the control block. GO carries a fresh unguessable nonce each
# round (or STOP, or a phase's end); DONE must echo it (or its negation, for a failed round).
# OUTS + c * outputs + k: where call c's output k lies once DONE is written (the CPU: its address
# in the server's memory; a GPU: its offset in the arena). CALLS: how many forward calls the round
# makes, each on its own input set (Layout.calls' slot sets; written by the harness before GO).
GO, DONE, READY, CALLS, OUTS = 0, 1, 2, 6, 8
# STAMPS + 0..2: the server's own clock (CLOCK_MONOTONIC ns, the harness's too) as it saw GO, as
# its forward's outputs were placed, and after the device's sync. Written by the server, so
# untrusted: the harness only logs them (where a round's time went), never decides on them.
STAMPS, STAMP_WORDS = 3, 3
STOP = -1  # GO: leave the server's loop and exit
NOWHERE = -1  # an OUTS word before the server has placed its output
CONTROL_BYTES = 4096
MESSAGE_AT, MESSAGE_BYTES = 1024, 3072  # the server's last error text (untrusted, for messages only)
MAX_OUTPUTS = MESSAGE_AT // 8 - OUTS
ALIGN = 256  # slot alignment: enough for vectorised loads on both backends
ARENA_MARGIN = 64 << 20  # the arena beyond the reference's own peak and a second copy of its outputs
ARENA_ALIGN = 2 << 20  # the arena's start and size: the caching allocator's large segments are 2 MiB multiples


def next_phase(phase: int) -> int:
    """GO's value that ends ``phase`` (negative, distinct from every round and from STOP)."""
    return -(1000 + phase)


@dataclass
class Slot:
    """One tensor in the slot memory (an output's: its shape and dtype; it has no place there)."""

    offset: int
    shape: list[int]
    dtype: str  # torch dtype name without the prefix, e.g. "float32"
    # An output's: whether the reference returns it contiguous; then a candidate must too
    # (level1/97_ScaledDotProductAttention's reference returns a transposed view).
    contiguous: bool = True

    @property
    def nbytes(self) -> int:
        return _numel(self.shape) * torch.empty((), dtype=self.torch_dtype).element_size()

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


@dataclass
class Layout:
    """Where every forward argument lives (scalars travel as values), the outputs' specs, and the arena."""

    args: list[dict[str, Any]]  # each {"slot": Slot-as-dict} or {"value": a constant non-tensor argument}: call 0's
    outputs: list[Slot]  # shapes and dtypes (their offsets are 0: an output lies where the server's forward left it)
    size: int
    device: str  # "cpu" or "cuda"
    arena_offset: int = 0  # a GPU's: where the arena starts in the slot memory
    arena_size: int = 0  # 0 on the CPU
    calls: int = 1  # forward calls a round makes at most: slot sets, call c's ``stride * c`` bytes after call 0's
    stride: int = 0  # bytes from one call's slot set to the next's

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Layout":
        args = [{"slot": Slot(**a["slot"])} if "slot" in a else {"value": a["value"]} for a in d["args"]]
        return cls(args=args, outputs=[Slot(**s) for s in d["outputs"]], size=int(d["size"]), device=d["device"],
                   arena_offset=int(d.get("arena_offset", 0)), arena_size=int(d.get("arena_size", 0)),
                   calls=int(d.get("calls", 1)), stride=int(d.get("stride", 0)))

    def call_args(self, call: int) -> list[dict[str, Any]]:
        """Call ``call``'s arguments: its own slots (call 0's moved by ``stride`` bytes a call), the same constants."""
        return [{"slot": dataclasses.replace(a["slot"], offset=a["slot"].offset + call * self.stride)} if "slot" in a else a
                for a in self.args]

    @property
    def arena(self) -> Slot:
        """The arena as one byte tensor of the slot memory."""
        return Slot(self.arena_offset, [self.arena_size], "uint8")


def plan_layout(inputs: list[Any], outputs: list[torch.Tensor], device: str, peak_bytes: int = 0, calls: int = 1) -> Layout:
    """A layout for a task's forward arguments and its reference outputs (shapes, dtypes, count),
    with slots for ``calls`` input sets.

    On a GPU the arena after the inputs holds what a round allocates: the reference's own peak
    (``peak_bytes``: one call's outputs and temporaries), the round's other calls' outputs, room
    for a second copy of one call's outputs (a candidate whose result lies elsewhere has it copied
    in) and a margin. (The server lets the last round's outputs go before a GPU round begins.)
    """
    if len(outputs) * calls > MAX_OUTPUTS:
        raise RuntimeError(f"the task's reference returns {len(outputs)} outputs; the environment serves at most "
                           f"{MAX_OUTPUTS} a round ({calls} call(s))")
    offset = 0
    args: list[dict[str, Any]] = []
    for value in inputs:
        if isinstance(value, torch.Tensor):
            slot = Slot(offset, list(value.shape), str(value.dtype).removeprefix("torch."))
            args.append({"slot": slot})
            offset = _align(offset + slot.nbytes)
        else:
            args.append({"value": value})
    outs = [Slot(0, list(value.shape), str(value.dtype).removeprefix("torch."), value.is_contiguous()) for value in outputs]
    stride, offset = offset, offset * calls
    if device == "cpu":
        return Layout(args=args, outputs=outs, size=max(offset, ALIGN), device=device, calls=calls, stride=stride)
    start = (offset + ARENA_ALIGN - 1) // ARENA_ALIGN * ARENA_ALIGN  # whole 2 MiB pages: the allocator's segments
    arena = (peak_bytes + calls * sum(o.nbytes for o in outs) + ARENA_MARGIN + ARENA_ALIGN - 1) // ARENA_ALIGN * ARENA_ALIGN
    return Layout(args=args, outputs=outs, size=start + arena, device=device, arena_offset=start, arena_size=arena,
                  calls=calls, stride=stride)


class Control:
    """The control block as int64 words, mapped from a memfd."""

    def __init__(self, fd: int):
        self.fd = fd
        self.map = mmap.mmap(fd, CONTROL_BYTES)
        self.words = memoryview(self.map).cast("q")

    @classmethod
    def create(cls) -> "Control":
        fd = _sealed_memfd("cuda-agent-control", CONTROL_BYTES)
        return cls(fd)

    def message(self) -> str:
        raw = bytes(self.map[MESSAGE_AT:MESSAGE_AT + MESSAGE_BYTES]).split(b"\0", 1)[0]
        return raw.decode("utf-8", errors="replace")

    def set_message(self, text: str) -> None:
        data = text.encode("utf-8", errors="replace")[:MESSAGE_BYTES - 1] + b"\0"
        self.map[MESSAGE_AT:MESSAGE_AT + len(data)] = data

    def close(self) -> None:
        self.words.release()
        self.map.close()


class SlotMemory:
    """The slots' memory: a memfd on the CPU, an fd-exported CUDA VMM allocation on a GPU."""

    def __init__(self, fd: int, size: int, device: str):
        self.fd, self.size, self.device = fd, size, device
        if device == "cpu":
            self._map = mmap.mmap(fd, size)
        else:
            self._vmm = _Vmm(fd, size)

    @classmethod
    def create(cls, size: int, device: str) -> "SlotMemory":
        if device == "cpu":
            return cls(_sealed_memfd("cuda-agent-slots", size), size, device)
        fd, size = _Vmm.export(size)
        return cls(fd, size, device)

    @classmethod
    def attach(cls, fd: int, size: int, device: str) -> "SlotMemory":
        return cls(fd, size, device)

    def address(self, offset: int) -> int:
        """A GPU slot memory's device address at ``offset`` (where the arena starts, say)."""
        return self._vmm.ptr.value + offset

    def view(self, slot: Slot) -> torch.Tensor:
        """A tensor of its own over the slot's bytes: no version counter shared with other slots."""
        if self.device == "cpu":
            raw = torch.frombuffer(self._map, dtype=torch.uint8, count=slot.nbytes, offset=slot.offset)
        else:
            raw = torch.as_tensor(_CudaArray(self._vmm.ptr.value + slot.offset, slot.nbytes), device="cuda")
        return raw.view(slot.torch_dtype).view(slot.shape)

    def close(self) -> None:
        if self.device == "cpu":
            try:
                self._map.close()
            except BufferError:  # a view still alive somewhere: the mapping goes with the process
                pass
        else:
            self._vmm.close()


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _sealed_memfd(name: str, size: int) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    return fd


# ----------------------------------------------------------------------------- CUDA VMM

_CU_MEM_ALLOCATION_TYPE_PINNED = 1
_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
_CU_MEM_LOCATION_TYPE_DEVICE = 1
_CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
_CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class _CudaArray:
    """A raw device range as __cuda_array_interface__, so torch can view it without a copy."""

    def __init__(self, ptr: int, size: int):
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (ptr, False), "version": 3,
                                         "strides": None, "stream": None}


class _Vmm:
    """One CUDA VMM allocation mapped into this process, shareable by file descriptor."""

    _lib: Any = None

    def __init__(self, fd: int, size: int):
        cu = self.driver()
        torch.zeros(1, device="cuda")  # the primary context, current on this thread
        # The allocation's own size, as export rounded it: a range reserved for the layout's
        # unrounded size is refused (CUDA_ERROR_INVALID_VALUE), as for 4096.12 MB of HingeLoss.
        size = self.size = self.rounded(size)
        self.handle = ctypes.c_ulonglong()
        _check(cu.cuMemImportFromShareableHandle(ctypes.byref(self.handle), ctypes.c_void_p(fd),
                                                 _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), "cuMemImportFromShareableHandle")
        self.ptr = ctypes.c_ulonglong()
        _check(cu.cuMemAddressReserve(ctypes.byref(self.ptr), ctypes.c_size_t(size), ctypes.c_size_t(0),
                                      ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)), "cuMemAddressReserve")
        _check(cu.cuMemMap(self.ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), self.handle, ctypes.c_ulonglong(0)), "cuMemMap")
        access = _AccessDesc(_Location(_CU_MEM_LOCATION_TYPE_DEVICE, _device_ordinal()), _CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        _check(cu.cuMemSetAccess(self.ptr, ctypes.c_size_t(size), ctypes.byref(access), ctypes.c_size_t(1)), "cuMemSetAccess")

    @classmethod
    def driver(cls):
        if cls._lib is None:
            cls._lib = ctypes.CDLL("libcuda.so.1")
        return cls._lib

    @classmethod
    def export(cls, size: int) -> tuple[int, int]:
        """A new allocation of at least ``size`` bytes on the current device: (fd, rounded size)."""
        cu = cls.driver()
        torch.zeros(1, device="cuda")
        prop = cls.properties()
        size = cls.rounded(size)
        handle = ctypes.c_ulonglong()
        _check(cu.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(prop), ctypes.c_ulonglong(0)), "cuMemCreate")
        fd = ctypes.c_int(-1)
        _check(cu.cuMemExportToShareableHandle(ctypes.byref(fd), handle, _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                               ctypes.c_ulonglong(0)), "cuMemExportToShareableHandle")
        cu.cuMemRelease(handle)  # the fd and the mappings made from it keep the memory alive
        return fd.value, size

    @staticmethod
    def properties() -> _AllocProp:
        return _AllocProp(_CU_MEM_ALLOCATION_TYPE_PINNED, _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                          _Location(_CU_MEM_LOCATION_TYPE_DEVICE, _device_ordinal()), None, _AllocFlags())

    @classmethod
    def rounded(cls, size: int) -> int:
        """``size`` up to the allocation granularity (2 MiB on an H100): what is created, reserved and mapped."""
        gran = ctypes.c_size_t()
        _check(cls.driver().cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(cls.properties()),
                                                          _CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity")
        return (size + gran.value - 1) // gran.value * gran.value

    def close(self) -> None:
        cu = self.driver()
        torch.cuda.synchronize()
        cu.cuMemUnmap(self.ptr, ctypes.c_size_t(self.size))
        cu.cuMemAddressFree(self.ptr, ctypes.c_size_t(self.size))
        cu.cuMemRelease(self.handle)


def _device_ordinal() -> int:
    return torch.cuda.current_device()


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed with CUresult {status}")
