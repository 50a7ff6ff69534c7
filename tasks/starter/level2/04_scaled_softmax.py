"""Temperature softmax with a learned per-column output gain: softmax(x / T, dim=-1) * gain."""
import torch
import torch.nn as nn

batch_size = 2048
dim = 8192
temperature = 0.5

PRESETS = {
    "cpp": {"batch_size": 256, "dim": 8192},
    "cuda": {"batch_size": 32768, "dim": 8192},
}


class Model(nn.Module):
    def __init__(self, dim: int, temperature: float):
        super().__init__()
        self.inv_temperature = 1.0 / temperature
        self.gain = nn.Parameter(1.0 + 0.5 * torch.rand(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * self.inv_temperature, dim=-1) * self.gain


def get_inputs():
    return [torch.randn(batch_size, dim) * 2.0]


def get_init_inputs():
    return [dim, temperature]
