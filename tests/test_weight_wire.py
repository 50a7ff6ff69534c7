"""The weights' wire formats: RPC packing (rollout/weight_packing.py) and flat buckets (learner/weight_wire.py)."""
from __future__ import annotations

import torch


def test_packed_weights_round_trip_exactly_in_buckets_of_the_asked_size():
    from rollout.weight_packing import pack_tensors, unpack_tensors

    tensors = [("scalar", torch.tensor(3.5)), ("bf16", torch.randn(64, 64).to(torch.bfloat16)),
               ("empty", torch.zeros(0, 2)), ("strided", torch.arange(12).view(3, 4).t()),
               ("big", torch.randn(300, 300))]
    buckets = list(pack_tensors(tensors, bucket_bytes=10_000))
    assert [len(b) for b in buckets] == [4, 1], "small tensors share a bucket; one larger than a bucket gets its own"
    out = list(unpack_tensors([p for b in buckets for p in b]))
    assert [n for n, _ in out] == [n for n, _ in tensors]
    for (name, want), (_, got) in zip(tensors, out):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), name


def test_flat_buckets_round_trip_every_dtype_and_shape_at_aligned_offsets():
    from learner.weight_wire import bucket_layout, flatten_bucket, unflatten_bucket

    named = [("a", torch.randn(3, 5)), ("b", torch.randn(7).to(torch.bfloat16)), ("c", torch.arange(3)),
             ("d", torch.tensor(2.5)), ("e", torch.empty(0, 4))]
    flat, layout = flatten_bucket(named)
    assert (layout, flat.numel()) == bucket_layout(named)
    assert all(offset % 16 == 0 for *_, offset in layout)
    for (name, original), (back_name, back) in zip(named, unflatten_bucket(flat, layout)):
        assert back_name == name and back.dtype == original.dtype and torch.equal(back, original)
