"""Dense matrix multiplication C = A @ B with A of shape (M, K) and B of shape (K, N)."""
import torch
import torch.nn as nn

M = 2048
K = 4096
N = 2048

PRESETS = {
    "cpp": {"M": 512, "K": 512, "N": 512},
    "cuda": {"M": 8192, "K": 4096, "N": 2048},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


def get_inputs():
    # B is scaled by 1/sqrt(K) so the outputs are O(1): the absolute error of a different
    # accumulation order then stays far below atol even for outputs near zero.
    return [torch.randn(M, K), torch.randn(K, N) / K**0.5]


def get_init_inputs():
    return []
