"""Matrix multiplication with a transposed right operand: C = A @ B^T, A (M, K), B (N, K)."""
import torch
import torch.nn as nn

M = 4096
K = 2048
N = 2048

PRESETS = {
    "cpp": {"M": 512, "K": 512, "N": 384},
    "cuda": {"M": 16384, "K": 2048, "N": 2048},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b.t())


def get_inputs():
    # B scaled by 1/sqrt(K): O(1) outputs, well inside the float32 tolerance.
    return [torch.randn(M, K), torch.randn(N, K) / K**0.5]


def get_init_inputs():
    return []
