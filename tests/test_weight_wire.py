"""The weights' one wire format (protocol/weights.py): flat buckets, carried as a tensor or as bytes."""
from __future__ import annotations

import pytest
import torch

from protocol.weights import bucket_layout, flatten_bucket, pack_buckets, size_bounded, unflatten_bucket, unpack_bucket


def test_packed_weights_round_trip_exactly_in_buckets_of_the_asked_size():
    tensors = [("scalar", torch.tensor(3.5)), ("bf16", torch.randn(64, 64).to(torch.bfloat16)),
               ("empty", torch.zeros(0, 2)), ("strided", torch.arange(12).view(3, 4).t()),
               ("big", torch.randn(300, 300))]
    buckets = list(pack_buckets(tensors, bucket_bytes=10_000))
    assert [len(layout) for layout, _ in buckets] == [4, 1], "small tensors share a bucket; one larger than a bucket gets its own"
    assert all(isinstance(data, bytes) for _, data in buckets), "the RPC carrier is plain bytes"
    out = [pair for layout, data in buckets for pair in unpack_bucket(layout, data)]
    assert [n for n, _ in out] == [n for n, _ in tensors]
    for (name, want), (_, got) in zip(tensors, out):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), name


def test_flat_buckets_round_trip_every_dtype_and_shape_at_aligned_offsets():
    named = [("a", torch.randn(3, 5)), ("b", torch.randn(7).to(torch.bfloat16)), ("c", torch.arange(3)),
             ("d", torch.tensor(2.5)), ("e", torch.empty(0, 4))]
    flat, layout = flatten_bucket(named)
    assert (layout, flat.numel()) == bucket_layout(named)
    assert all(offset % 16 == 0 for *_, offset in layout)
    for (name, original), (back_name, back) in zip(named, unflatten_bucket(flat, layout)):
        assert back_name == name and back.dtype == original.dtype and torch.equal(back, original)


def test_a_layout_that_reaches_past_its_bucket_or_names_no_dtype_is_refused():
    flat, layout = flatten_bucket([("w", torch.ones(4))])
    with pytest.raises(ValueError, match="outside the bucket"):
        unflatten_bucket(flat, [("w", "float32", [8], 0)])
    with pytest.raises(ValueError, match="unknown dtype"):
        unflatten_bucket(flat, [("w", "Tensor", [4], 0)])


def test_size_bounded_keeps_order_and_gives_an_oversized_item_its_own_bucket():
    sizes = [3, 3, 5, 12, 1, 1]
    assert list(size_bounded(sizes, lambda n: n, 6)) == [[3, 3], [5], [12], [1, 1]]
    with pytest.raises(ValueError, match="positive"):
        list(size_bounded(sizes, lambda n: n, 0))
