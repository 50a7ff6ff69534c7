"""Inclusive prefix sum (cumulative sum) along the last dimension of a (batch, length) tensor."""
import torch
import torch.nn as nn

batch_size = 256
length = 32768

PRESETS = {
    "cpp": {"batch_size": 256, "length": 8192},
    "cuda": {"batch_size": 16384, "length": 32768},
}


class Model(nn.Module):
    def __init__(self, dim: int = 1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=self.dim)


def get_inputs():
    # Positive terms (uniform in [0, 1)): the running sums grow monotonically and stay far
    # from zero, so a parallel scan with a different summation order agrees to ~1e-6 relative.
    return [torch.rand(batch_size, length)]


def get_init_inputs():
    return [1]
