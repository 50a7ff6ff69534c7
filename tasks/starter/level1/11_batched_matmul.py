"""Batched matrix multiplication: C[b] = A[b] @ B[b] for A (batch, M, K) and B (batch, K, N)."""
import torch
import torch.nn as nn

batch_size = 64
M = 512
K = 512
N = 512

PRESETS = {
    "cpp": {"batch_size": 16, "M": 128, "K": 256, "N": 256},
    "cuda": {"batch_size": 512, "M": 512, "K": 512, "N": 512},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)


def get_inputs():
    # B scaled by 1/sqrt(K): O(1) outputs, well inside the float32 tolerance.
    return [torch.randn(batch_size, M, K), torch.randn(batch_size, K, N) / K**0.5]


def get_init_inputs():
    return []
