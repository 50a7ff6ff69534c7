"""Swish / SiLU activation: x * sigmoid(x), elementwise."""
import torch
import torch.nn as nn

batch_size = 4096
dim = 4096

PRESETS = {
    "cpp": {"batch_size": 1024, "dim": 2048},
    "cuda": {"batch_size": 131072, "dim": 4096},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
