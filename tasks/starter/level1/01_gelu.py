"""GELU activation (exact, erf-based) applied elementwise to a 2-D tensor."""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 8192
dim = 4096

PRESETS = {
    "cpp": {"batch_size": 512, "dim": 2048},
    "cuda": {"batch_size": 262144, "dim": 4096},
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
