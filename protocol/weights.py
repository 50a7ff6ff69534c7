"""The one wire format of the policy's weights on their way from the learner to the generators.

Every transport (actors/weight_sync.py) moves a bucket of tensors as one flat uint8 buffer
and its layout, one ``FlatEntry`` per tensor, with which the receiver (the vLLM worker
extension, rollout/vllm_worker_ext.py) cuts the buffer back into named tensors. Only the
buffer's carrier differs: a GPU tensor broadcast over NCCL, a CUDA IPC handle (bytes) to the
learner's own GPU memory, or the buffer's bytes in a vLLM RPC message (the object-store path:
bytes travel natively on every vLLM version, whereas its tensor encoding changed between them).

Both sides must agree on every detail (the 16-byte alignment, the entry's fields, how a handle
is encoded), so producer and consumer sit together here, in plain torch, below both.
"""
from __future__ import annotations

import math
import pickle
from typing import Any, Callable, Iterable, Iterator, TypeVar

import torch

# One tensor's place in a flattened bucket: (name, dtype name as in torch, shape, byte offset).
FlatEntry = tuple[str, str, list[int], int]
_ALIGN = 16  # each tensor starts on a 16-byte boundary, so every dtype's view of the bytes is aligned

Item = TypeVar("Item")


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def size_bounded(items: Iterable[Item], nbytes: Callable[[Item], int], bucket_bytes: int) -> Iterator[list[Item]]:
    """Items grouped in order into buckets of at most ``bucket_bytes`` (one larger than that is a bucket
    of its own): a bucket bounds one message, so a large model is never sent as one."""
    if bucket_bytes <= 0:
        raise ValueError(f"weight bucket size must be positive, got {bucket_bytes} bytes")
    bucket: list[Item] = []
    size = 0
    for item in items:
        n = nbytes(item)
        if bucket and size + n > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append(item)
        size += n
    if bucket:
        yield bucket


def bucket_layout(named: Iterable[tuple[str, torch.Tensor]]) -> tuple[list[FlatEntry], int]:
    """Where each tensor of a bucket lies in its flat byte buffer, and the buffer's size."""
    layout, size = [], 0
    for name, t in named:
        layout.append((name, str(t.dtype).removeprefix("torch."), list(t.shape), size))
        size = _aligned(size + t.numel() * t.element_size())
    return layout, size


def flatten_bucket(named: list[tuple[str, torch.Tensor]]) -> tuple[torch.Tensor, list[FlatEntry]]:
    """The bucket's tensors copied into one uint8 buffer on their device, and its layout."""
    layout, size = bucket_layout(named)
    flat = torch.empty(size, dtype=torch.uint8, device=named[0][1].device)
    for (_, t), (_, _, _, offset) in zip(named, layout):
        n = t.numel() * t.element_size()
        flat[offset:offset + n].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
    return flat, layout


def unflatten_bucket(flat: torch.Tensor, layout: Iterable[Any]) -> list[tuple[str, torch.Tensor]]:
    """Views of ``flat`` in the bucket's layout (no copy)."""
    out = []
    for name, dtype, shape, offset in layout:
        torch_dtype = getattr(torch, dtype, None)
        if not isinstance(torch_dtype, torch.dtype):
            raise ValueError(f"weight {name!r}: unknown dtype {dtype!r}")
        n = math.prod(shape) * torch_dtype.itemsize
        if offset < 0 or offset + n > flat.numel():
            raise ValueError(f"weight {name!r}: bytes {offset}..{offset + n} lie outside the bucket's {flat.numel()}")
        out.append((name, flat[offset:offset + n].view(torch_dtype).reshape(shape)))
    return out


def pack_buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[tuple[list[FlatEntry], bytes]]:
    """Size-bounded buckets as (layout, the flat buffer's bytes): the RPC carrier of the format."""
    nbytes = lambda item: item[1].numel() * item[1].element_size()  # noqa: E731
    for bucket in size_bounded(named, nbytes, bucket_bytes):
        flat, layout = flatten_bucket([(name, t.detach().to("cpu")) for name, t in bucket])
        yield layout, flat.numpy().tobytes()


def unpack_bucket(layout: Iterable[Any], data: bytes) -> list[tuple[str, torch.Tensor]]:
    """A packed bucket's tensors (they share one writable buffer of their own)."""
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return unflatten_bucket(flat, layout)


def ipc_handle(flat: torch.Tensor) -> bytes:
    """A CUDA IPC handle for ``flat``, as bytes. It is pickled because vLLM's RPC codec does not
    carry torch's rebuild function; only our own learner produces these bytes."""
    from torch.multiprocessing.reductions import reduce_tensor

    return pickle.dumps(reduce_tensor(flat))


def open_ipc_handle(handle: bytes, device: torch.device) -> torch.Tensor:
    """The learner's tensor, mapped into this process. The learner's device index is its own
    numbering; the tensor lives on the GPU this worker sees as ``device``."""
    rebuild, args = pickle.loads(handle)
    args = list(args)
    args[6] = device.index if device.index is not None else torch.cuda.current_device()
    return rebuild(*args)
