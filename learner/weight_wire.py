"""The wire format of the learner's weights on their way to the generators' vLLM workers.

The NCCL and CUDA IPC transports (actors/weight_sync.py) move a bucket of tensors as one flat
uint8 buffer: one broadcast or one IPC handle per bucket instead of one per tensor. Beside the
buffer travels its layout, one ``FlatEntry`` per tensor; the receiver cuts the buffer back into
named tensors with it. A CUDA IPC handle travels as bytes.

Both sides must agree on every detail here (the 16-byte alignment, the entry's fields, how a
handle is encoded), so producer and consumer functions sit together in this one module, which
is plain torch with no learner or vLLM state. The learner produces the format and owns it; the
rollout's worker extension (rollout/vllm_worker_ext.py) imports this module, and only this one,
from the learner: a declared exception to the layer rule, like env_pool.results or
rollout.trajectory (pyproject.toml, [tool.importlinter]).
"""
from __future__ import annotations

import math
import pickle
from typing import Any, Iterable

import torch

# One tensor's place in a flattened bucket: (name, dtype name as in torch, shape, byte offset).
FlatEntry = tuple[str, str, list[int], int]
_ALIGN = 16  # each tensor starts on a 16-byte boundary, so every dtype's view of the bytes is aligned


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def bucket_layout(named: Iterable[tuple[str, torch.Tensor]]) -> tuple[list[FlatEntry], int]:
    """Where each tensor of a bucket lies in its flat byte buffer, and the buffer's size."""
    layout, size = [], 0
    for name, t in named:
        layout.append((name, str(t.dtype).removeprefix("torch."), list(t.shape), size))
        size = _aligned(size + t.numel() * t.element_size())
    return layout, size


def flatten_bucket(named: list[tuple[str, torch.Tensor]]) -> tuple[torch.Tensor, list[FlatEntry]]:
    """The bucket's tensors copied into one uint8 buffer on their device: one broadcast or one
    IPC handle per bucket instead of one per tensor."""
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
        out.append((name, flat[offset:offset + n].view(torch_dtype).reshape(shape)))
    return out


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
