"""RMS normalization over the last dimension: x / sqrt(mean(x^2) + eps) * weight."""
import torch
import torch.nn as nn

batch_size = 16
seq_len = 1024
hidden = 2048

PRESETS = {
    "cpp": {"batch_size": 4, "seq_len": 512, "hidden": 1024},
    "cuda": {"batch_size": 128, "seq_len": 1024, "hidden": 2048},
}


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x * rms * self.weight


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden)]


def get_init_inputs():
    return [hidden]
