"""Weights packed as raw bytes for vLLM's RPC messages: the object-store transport's last leg.

VLLMPolicy (rollout/vllm_policy.py) packs the tensors it was handed into size-bounded buckets
and stages each in the vLLM workers, whose extension (rollout/vllm_worker_ext.py) unpacks
them. Tensors travel as raw bytes because the message codec carries bytes natively on every
vLLM version, whereas its tensor encoding changed between versions.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch

# A packed tensor: (name, dtype name as in torch, shape, raw bytes in C order).
PackedTensor = tuple[str, str, list[int], bytes]


def pack_tensors(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[list[PackedTensor]]:
    """Group tensors into buckets of about bucket_bytes (a larger tensor gets a bucket of its own).

    Buckets bound the size of one RPC message, so a large model never has its whole state
    serialised into one message.
    """
    bucket: list[PackedTensor] = []
    size = 0
    for name, tensor in named_tensors:
        t = tensor.detach().to("cpu").contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""  # the shape travels apart
        if bucket and size + len(data) > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, str(t.dtype).removeprefix("torch."), list(t.shape), data))
        size += len(data)
    if bucket:
        yield bucket


def unpack_tensors(packed: Iterable[Any]) -> Iterator[tuple[str, torch.Tensor]]:
    for name, dtype, shape, data in packed:
        torch_dtype = getattr(torch, dtype, None)
        if not isinstance(torch_dtype, torch.dtype):
            raise ValueError(f"weight {name!r}: unknown dtype {dtype!r}")
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8) if len(data) else torch.empty(0, dtype=torch.uint8)
        yield name, raw.view(torch_dtype).reshape(shape)
