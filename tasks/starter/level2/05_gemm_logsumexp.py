"""Linear layer, scaling by a constant, then log-sum-exp over the output features (one value per row)."""
import torch
import torch.nn as nn

batch_size = 4096
in_features = 4096
out_features = 2048
scale = 4.0

PRESETS = {
    "cpp": {"batch_size": 256, "in_features": 1024, "out_features": 512},
    "cuda": {"batch_size": 8192, "in_features": 4096, "out_features": 2048},
}


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, scale: float):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x) * self.scale
        return torch.logsumexp(y, dim=1, keepdim=True)


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scale]
