"""Argmax over dim 1 of a (batch, dim1, dim2) tensor; returns int64 indices."""
import torch
import torch.nn as nn

batch_size = 128
dim1 = 1024
dim2 = 512

PRESETS = {
    "cpp": {"batch_size": 16, "dim1": 256, "dim2": 256},
    "cuda": {"batch_size": 2048, "dim1": 1024, "dim2": 512},
}


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.argmax(x, dim=self.dim)


def get_inputs():
    # Continuous random values: ties have probability ~0, so the answer is unique.
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs():
    return [1]
