"""The policy's full weights as size-bounded buckets, for hot-swapping into the generators.

Under ZeRO-3 each rank holds a shard of every parameter; a bucket's parameters are gathered
together (deepspeed.zero.GatheredParameters), copied out and released, so peak extra memory
is one bucket, not a model. Under ZeRO-2 every rank holds the full weights and the tensors
are yielded as they are, without a copy.

Names are the Hugging Face model's own (``model.layers.0.self_attn.q_proj.weight``), which
is what vLLM's ``load_weights`` expects; tied weights appear once.
"""
from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

from protocol.weights import size_bounded


def _nbytes(param: torch.Tensor) -> int:
    numel = getattr(param, "ds_numel", None)  # a ZeRO-3 parameter's full size; .numel() is its shard
    return (numel if numel is not None else param.numel()) * param.element_size()


def iter_weight_buckets(module: nn.Module, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Buckets of (name, tensor) covering every parameter once, each at most ``bucket_bytes``
    except a single tensor larger than that, which is a bucket of its own.

    Every rank must iterate (the ZeRO-3 gathers are collective). The tensors are valid until
    the next optimiser step (ZeRO-2) or are private copies (ZeRO-3).
    """
    from deepspeed import DeepSpeedEngine

    if isinstance(module, DeepSpeedEngine):
        module = module.module
    for bucket in size_bounded(module.named_parameters(), lambda item: _nbytes(item[1]), bucket_bytes):
        yield _materialise(bucket)


def _materialise(bucket: list[tuple[str, nn.Parameter]]) -> list[tuple[str, torch.Tensor]]:
    params = [p for _, p in bucket]
    if not any(hasattr(p, "ds_id") for p in params):
        return [(name, p.detach()) for name, p in bucket]
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        return [(name, p.detach().clone()) for name, p in bucket]
